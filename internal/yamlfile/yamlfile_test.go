package yamlfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type cfg struct {
		Slots int `yaml:"slots"`
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var c cfg
	if err := Decode(write("ok.yaml", "slots: 3\n"), &c); err != nil || c.Slots != 3 {
		t.Fatalf("Decode: %+v %v", c, err)
	}
	if err := Decode(write("typo.yaml", "slotz: 3\n"), &c); err == nil || !strings.Contains(err.Error(), "slotz") {
		t.Fatalf("an unknown key: %v, want an error naming it", err)
	}
	if err := Decode(filepath.Join(dir, "missing.yaml"), &c); err == nil || !strings.Contains(err.Error(), "open config") {
		t.Fatalf("a missing file: %v", err)
	}
}
