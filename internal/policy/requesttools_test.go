package policy

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

func TestParseRequestTools(t *testing.T) {
	cases := []struct {
		name    string
		raw     string
		want    map[string]bool
		wantErr string
	}{
		{"absent", "", nil, ""},
		{"null", "null", nil, ""},
		{"empty object", "{}", map[string]bool{}, ""},
		{"disables", `{"write_file": false, "run_shell": false}`, map[string]bool{"write_file": false, "run_shell": false}, ""},
		{"true kept", `{"read_file": true}`, map[string]bool{"read_file": true}, ""},
		{"unknown names kept", `{"no_such_tool": false}`, map[string]bool{"no_such_tool": false}, ""},
		{"white space", " \n{ \"a\" : false }\n", map[string]bool{"a": false}, ""},
		{"array", `["write_file"]`, nil, "not an array"},
		{"string", `"write_file"`, nil, "not a string"},
		{"number", `1`, nil, "not a number"},
		{"boolean", `false`, nil, "not a boolean"},
		{"string value", `{"write_file": "false"}`, nil, `"write_file" maps to a string`},
		{"number value", `{"write_file": 0}`, nil, "maps to a number"},
		{"null value", `{"write_file": null}`, nil, "maps to null"},
		{"object value", `{"write_file": {"enabled": false}}`, nil, "maps to an object"},
		{"duplicate", `{"a": false, "a": true}`, nil, "twice"},
		{"trailing data", `{"a": false} {}`, nil, "after the object"},
		{"truncated", `{"a": false`, nil, "parse tools"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRequestTools(json.RawMessage(c.raw))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseRequestTools(%s) = %v, %v; want an error saying %q", c.raw, got, err, c.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("ParseRequestTools(%s) = %v, %v; want %v", c.raw, got, err, c.want)
			}
		})
	}
}
