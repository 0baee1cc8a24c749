package dispatcher

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
