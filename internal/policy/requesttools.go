package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ParseRequestTools reads a request's "tools" field: a JSON object of tool name to boolean, such as
// {"write_file": false, "run_shell": false}. A tool mapped to false is refused for that request; true
// changes nothing (a request cannot re-enable what its tenant disabled); unknown names are kept and
// ignored; an empty object or an absent field (nil, null) changes nothing. Anything else (not an object,
// a value that is not a boolean, a name given twice) is an error written for the caller to fix.
func ParseRequestTools(raw json.RawMessage) (map[string]bool, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil, nil
	}
	if trimmed[0] != '{' {
		return nil, fmt.Errorf(`parse tools: want a JSON object of tool names to booleans, like {"write_file": false}, not %s`, jsonKind(trimmed))
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("parse tools: %w", err)
	}
	out := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("parse tools: %w", err)
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("parse tools: %w", err)
		}
		var b bool
		if err := json.Unmarshal(v, &b); err != nil || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return nil, fmt.Errorf("parse tools: %q maps to %s: use true or false", name, jsonKind(v))
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("parse tools: %q is given twice: give each tool once", name)
		}
		out[name] = b
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("parse tools: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse tools: unexpected data after the object")
	}
	return out, nil
}

func jsonKind(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}
