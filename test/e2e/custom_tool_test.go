package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// customTool is declared to both the dispatcher (schema, listing) and the worker (how to run it).
const customTool = `
tools:
  custom:
    - name: count_words
      description: Count the words of a text. Returns the count.
      kind: read
      schema:
        type: object
        properties:
          text: {type: string, description: the text to count}
        required: [text]
        additionalProperties: false
      command: ["/bin/sh", "-c", "tr -c 'a-z' ' ' | wc -w"]
`

// TestCustomTool: an operator-declared tool is listed, validated, and run in its own container with its
// arguments as JSON on stdin.
func TestCustomTool(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy, extraConfig: customTool, workerConfig: customTool})
	if r := s.do(t, http.MethodGet, "/v1/tools?format=mcp", "dev-token", nil); !strings.Contains(string(r.body), `"count_words"`) {
		t.Fatalf("not listed: %s", r.body)
	}
	r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "count_words", "workspace": "ws",
		"args": map[string]any{"text": "one two three"}})
	res := r.result(t)
	// stdin is {"text":"one two three"}: the lowercase runs are text, one, two, three.
	if res.Status != call.StatusOK || strings.TrimSpace(res.Stdout) != "4" {
		t.Fatalf("HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "count_words", "args": map[string]any{"txt": 1}}); r.code != http.StatusUnprocessableEntity {
		t.Fatalf("bad args: HTTP %d %s", r.code, r.body)
	}
}
