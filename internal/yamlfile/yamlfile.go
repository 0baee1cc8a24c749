// Package yamlfile reads the configuration files of toolpool's commands: YAML, strictly, so that a key the
// program does not know (a typo, a setting of another version) is an error that names it rather than a
// setting silently ignored.
package yamlfile

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Decode reads the YAML file at path into v, refusing keys that v has no field for.
func Decode(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) { // one line per file: the decoder lists its errors on lines of their own
			return fmt.Errorf("read config %s: %s: correct or remove those keys", path, strings.Join(te.Errors, "; "))
		}
		return fmt.Errorf("read config %s: %w", path, err)
	}
	return nil
}
