package dispatcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestOpenAPIServed: GET /v1/openapi.json answers the embedded OpenAPI 3.1 document, without a token.
func TestOpenAPIServed(t *testing.T) {
	h := newHarness(t, setup{})
	r := h.do(http.MethodGet, "/v1/openapi.json", "", nil)
	if r.code != http.StatusOK || !bytes.Equal(r.body, openAPI) {
		t.Fatalf("HTTP %d, %d bytes; want 200 and the %d bytes of openapi.json", r.code, len(r.body), len(openAPI))
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi.json: version %q, %v; want 3.1.0", doc.OpenAPI, err)
	}
}

// TestOpenAPIOperationsAreRouted: every operation that openapi.json lists reaches a handler of the API,
// never the catch-all "no endpoint" answer (cmd/dispatcher serves /metrics beside the API: test/clients
// checks it on the real stack).
func TestOpenAPIOperationsAreRouted(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	mux, ok := (&api{newHarness(t, setup{}).srv}).routes().(*http.ServeMux)
	if !ok {
		t.Fatal("the API's routes are not a *http.ServeMux")
	}
	ops := 0
	for path, item := range doc.Paths {
		if path == "/metrics" {
			continue
		}
		concrete := strings.NewReplacer("{id}", "c_aaaaaaaaaaaaaaaaaaaaaaaaaa", "{stream}", "stdout",
			"{name}", "ws1", "{path}", "dir/a.txt").Replace(path)
		for method := range item {
			if method == "parameters" {
				continue
			}
			ops++
			req := httptest.NewRequest(strings.ToUpper(method), concrete, nil)
			if _, pattern := mux.Handler(req); pattern == "/" || pattern == "" {
				t.Errorf("openapi.json lists %s %s, which the API does not route (pattern %q)", req.Method, path, pattern)
			}
		}
	}
	if ops < 20 {
		t.Fatalf("openapi.json lists %d operations; want every operation of the API (over 20)", ops)
	}
}

// TestOpenAPIDocumentIsWellFormed checks what a client generator relies on and JSON Schema validation
// does not: every local $ref (and x-toolpool-events' schema) resolves, every operation has a unique operationId and responses with a
// description, and every {parameter} of a path is declared as a required path parameter.
func TestOpenAPIDocumentIsWellFormed(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	lookup := func(ref string) (any, bool) {
		var cur any = doc
		for _, tok := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, ok := cur.(map[string]any)
			if !ok {
				return nil, false
			}
			if cur, ok = m[strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)]; !ok {
				return nil, false
			}
		}
		return cur, true
	}
	var walk func(at string, v any)
	walk = func(at string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				refs := []any{x}
				if k == "x-toolpool-events" { // event name to the schema of its data
					refs = slices.Collect(maps.Values(x.(map[string]any)))
				}
				for _, r := range refs {
					if s, ok := r.(string); ok && (k == "$ref" || k == "x-toolpool-events") {
						if _, found := lookup(s); !strings.HasPrefix(s, "#/") || !found {
							t.Errorf("%s: %s %q does not resolve in the document", at, k, s)
						}
					}
				}
				walk(at+"/"+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s/%d", at, i), x)
			}
		}
	}
	walk("#", doc)
	deref := func(v any) map[string]any {
		m, _ := v.(map[string]any)
		if ref, ok := m["$ref"].(string); ok {
			r, _ := lookup(ref)
			m, _ = r.(map[string]any)
		}
		return m
	}
	ids := map[string]string{}
	for path, item := range doc["paths"].(map[string]any) {
		item := item.(map[string]any)
		declared := map[string]bool{}
		params := func(list any) {
			for _, p := range asSlice(list) {
				if p := deref(p); p["in"] == "path" && p["required"] == true {
					declared[p["name"].(string)] = true
				}
			}
		}
		params(item["parameters"])
		for method, op := range item {
			if method == "parameters" {
				continue
			}
			op := op.(map[string]any)
			name := strings.ToUpper(method) + " " + path
			id, _ := op["operationId"].(string)
			if prev, dup := ids[id]; id == "" || dup {
				t.Errorf("%s: operationId %q is empty or also %s's", name, id, prev)
			}
			ids[id] = name
			for code, resp := range op["responses"].(map[string]any) {
				if r := deref(resp); r == nil || r["description"] == nil {
					t.Errorf("%s: response %s has no description", name, code)
				}
			}
			saved := maps.Clone(declared)
			params(op["parameters"])
			for _, seg := range strings.Split(path, "/") {
				if p, ok := strings.CutPrefix(seg, "{"); ok && !declared[strings.TrimSuffix(p, "}")] {
					t.Errorf("%s: path parameter %s is not declared (in: path, required: true)", name, seg)
				}
			}
			declared = saved
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
