package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCrun writes an executable that answers --version as a crun of version would ("" answers nothing).
func fakeCrun(t *testing.T, version string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "crun")
	script := "#!/bin/sh\n"
	if version != "" {
		script += "echo 'crun version " + version + "'\necho 'commit: 0'\n"
	}
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestCrunRefusal(t *testing.T) {
	for _, tc := range []struct {
		name        string
		controllers *string // nil: no v2 hierarchy at all
		version     string
		refused     bool
	}{
		{name: "cgroup v1 alone", version: "1.8.1"},
		{name: "hybrid with an empty v2 hierarchy", controllers: ptr(""), version: "1.8.1"},
		{name: "hybrid with hugetlb on v2, crun 1.8", controllers: ptr("hugetlb\n"), version: "1.8.1", refused: true},
		{name: "hybrid with hugetlb on v2, crun 1.9", controllers: ptr("hugetlb\n"), version: "1.9"},
		{name: "hybrid with hugetlb on v2, crun 1.21", controllers: ptr("hugetlb\n"), version: "1.21.0"},
		{name: "hybrid, version unknown", controllers: ptr("hugetlb"), version: "", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "cgroup.controllers")
			if tc.controllers != nil {
				if err := os.WriteFile(file, []byte(*tc.controllers), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			why := crunVersion(context.Background(), fakeCrun(t, tc.version)).refusal(file)
			if tc.refused != (why != "") {
				t.Fatalf("refused = %q, want refused %v", why, tc.refused)
			}
			if tc.refused && (!strings.Contains(why, "hugetlb") || !strings.Contains(why, "crun 1.9 or later")) {
				t.Fatalf("refusal %q does not name the controller and the fix", why)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestAutoPicksCrunWhereItHolds: "auto" picks the crun on PATH when it is recent enough (and so able to run
// on any cgroup layout), and runc with the reason for an old one; runc quietly when there is no crun; other
// handlers get no binary at all.
func TestAutoPicksCrunWhereItHolds(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		version, handler, want string
		note                   bool
	}{
		{version: "1.30", handler: RuncHandler, want: "crun"},
		{version: "1.8.1", handler: RuncHandler, want: "runc", note: true},
		{version: "none", handler: RuncHandler, want: "runc"},
		{version: "1.30", handler: "io.containerd.runsc.v1", want: ""},
	} {
		t.Run(tc.version+" "+tc.handler, func(t *testing.T) {
			dir := t.TempDir()
			if tc.version != "none" {
				dir = filepath.Dir(fakeCrun(t, tc.version))
			}
			t.Setenv("PATH", dir)
			got, notes, err := resolveRuntimeBinary(ctx, tc.handler, RuntimeBinaryAuto)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || (len(notes) > 0) != tc.note {
				t.Fatalf("auto = %q, notes %q; want %q, a note %v", got, notes, tc.want, tc.note)
			}
			if tc.note && !strings.Contains(notes[0], "older than "+MinCrunVersion) && !strings.Contains(notes[0], "crun before 1.9 refuses") {
				t.Fatalf("note %q says neither why crun is not used nor what to do", notes[0])
			}
		})
	}
	if got, _, err := resolveRuntimeBinary(ctx, RuncHandler, "/opt/runc"); got != "/opt/runc" || err != nil {
		t.Fatalf("an explicit binary became %q (%v)", got, err)
	}
}

// TestMinCrun: the numbers the version check compares with are the documented MinCrunVersion.
func TestMinCrun(t *testing.T) {
	if got := fmt.Sprintf("%d.%d", minCrun.major, minCrun.minor); got != MinCrunVersion {
		t.Fatalf("minCrun is %s, MinCrunVersion %s", got, MinCrunVersion)
	}
}
