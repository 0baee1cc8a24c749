package clients

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestOpenAPIContract sends requests to every operation of the OpenAPI document, on the real stack, the
// ones that succeed and the refusals of each kind a client can provoke, and checks every answer against
// the document: status, media type, body schema, each event of an event stream. It fails unless every
// operation of the document answered at least once.
func TestOpenAPIContract(t *testing.T) {
	c := contractClient(t, startStack(t, ""))
	want := func(a answer, code int, what string) map[string]any {
		t.Helper()
		if a.code != code {
			t.Fatalf("%s: HTTP %d, want %d: %s", what, a.code, code, trim(a.body))
		}
		if strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
			return a.json(t)
		}
		return nil
	}
	wantError := func(a answer, code int, typ, what string) {
		t.Helper()
		e, _ := want(a, code, what)["error"].(map[string]any)
		if e["type"] != typ {
			t.Fatalf("%s: error %v, want type %s", what, e, typ)
		}
	}

	// The service's own endpoints.
	want(c.send("GET", "/v1/openapi.json", "", nil), 200, "the document")
	want(c.send("GET", "/healthz", "", nil), 200, "healthz")
	want(c.send("GET", "/readyz", "", nil), 200, "readyz")
	if a := want(c.send("GET", "/metrics", "", nil), 200, "metrics"); a != nil {
		t.Fatal("metrics answered JSON")
	}

	// Calls.
	shell := func(cmd string, extra map[string]any) map[string]any {
		b := map[string]any{"tool": "run_shell", "args": map[string]any{"command": cmd}, "workspace": "ws1"}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	ran := want(c.send("POST", "/v1/calls", callerToken, shell("printf 'hi\\n'; printf 'oops\\n' >&2", nil)), 200, "a call")
	if ran["status"] != "ok" || ran["stdout"] != "hi\n" || ran["stderr"] != "oops\n" {
		t.Fatalf("a call: %v", ran)
	}
	id := ran["id"].(string)
	queued := want(c.send("POST", "/v1/calls", callerToken, shell("true", map[string]any{"wait": false})), 202, "wait false")
	want(c.send("GET", "/v1/calls/"+queued["id"].(string)+"?wait=60s", callerToken, nil), 200, "long poll")
	wantError(c.send("POST", "/v1/calls", "", shell("true", nil)), 401, "unauthorized", "no token")
	wantError(c.send("POST", "/v1/calls", "nobody", shell("true", nil)), 401, "unauthorized", "an unknown token")
	wantError(c.send("POST", "/v1/calls", callerToken, `{"tool":`), 400, "invalid_request", "malformed JSON")
	wantError(c.send("POST", "/v1/calls", callerToken, map[string]any{"tool": "no_such_tool", "args": map[string]any{}}), 422, "invalid_params", "unknown tool")
	wantError(c.send("POST", "/v1/calls", callerToken, map[string]any{"tool": "run_shell", "args": map[string]any{"command": 3}}), 422, "invalid_params", "arguments off the schema")
	wantError(c.send("POST", "/v1/calls", callerToken, shell(strings.Repeat("x", 1<<20), nil)), 413, "too_large", "a body too large")
	denied := want(c.send("POST", "/v1/calls", callerToken, shell("sudo ls", nil)), 403, "a denied call")
	if denied["status"] != "denied" {
		t.Fatalf("a denied call: %v", denied)
	}
	want(c.send("POST", "/v1/calls", callerToken, shell("echo once", map[string]any{"idempotency_key": "k1"})), 200, "a keyed call")
	wantError(c.send("POST", "/v1/calls", callerToken, shell("echo twice", map[string]any{"idempotency_key": "k1"})), 409, "idempotency_key_reused", "a key reused")
	streamed := c.send("POST", "/v1/calls", callerToken, shell("for i in 1 2 3; do echo line $i; done", nil), "Accept", "text/event-stream")
	want(streamed, 200, "a streamed call")
	if !strings.Contains(string(streamed.body), "line 3") {
		t.Fatalf("a streamed call: %s", streamed.body)
	}

	// A call's state, events and output.
	want(c.send("GET", "/v1/calls/"+id, callerToken, nil), 200, "get")
	wantError(c.send("GET", "/v1/calls/c_aaaaaaaaaaaaaaaaaaaaaaaaaa", callerToken, nil), 404, "not_found", "an unknown call")
	want(c.send("GET", "/v1/calls/"+id+"/events", callerToken, nil), 200, "events")
	want(c.send("GET", "/v1/calls/"+id+"/events", callerToken, nil, "Last-Event-ID", "2.0"), 200, "events resumed")
	wantError(c.send("GET", "/v1/calls/"+id+"/events", callerToken, nil, "Last-Event-ID", "x"), 400, "invalid_request", "a bad Last-Event-ID")
	wantError(c.send("GET", "/v1/calls/c_aaaaaaaaaaaaaaaaaaaaaaaaaa/events", callerToken, nil), 404, "not_found", "events of an unknown call")
	out := c.send("GET", "/v1/calls/"+id+"/stdout?offset=1", callerToken, nil)
	if want(out, 200, "stdout"); string(out.body) != "i\n" || out.header.Get("X-Toolpool-Next-Offset") != "3" {
		t.Fatalf("stdout from 1: %q, next %s", out.body, out.header.Get("X-Toolpool-Next-Offset"))
	}
	wantError(c.send("GET", "/v1/calls/"+id+"/stderr?limit=0", callerToken, nil), 400, "invalid_request", "a bad limit")
	wantError(c.send("GET", "/v1/calls/c_aaaaaaaaaaaaaaaaaaaaaaaaaa/stdout", callerToken, nil), 404, "not_found", "stdout of an unknown call")

	// Tools and policy.
	for _, f := range []string{"", "native", "openai", "anthropic", "mcp"} {
		want(c.send("GET", "/v1/tools?format="+f, callerToken, nil), 200, "tools "+f)
	}
	wantError(c.send("GET", "/v1/tools?format=yaml", callerToken, nil), 400, "invalid_request", "an unknown format")
	check := want(c.send("POST", "/v1/policy/check", callerToken, shell("mkdir x", nil)), 200, "policy check")
	if check["would_run"] != false {
		t.Fatalf("policy check of mkdir: %v", check)
	}
	wantError(c.send("POST", "/v1/policy/check", callerToken, map[string]any{"tool": "nope"}), 422, "invalid_params", "policy check of an unknown tool")

	// Approvals.
	park := func() string {
		t.Helper()
		p := want(c.send("POST", "/v1/calls", callerToken, shell("mkdir -p made", nil)), 202, "a call that asks")
		if p["status"] != "pending_approval" {
			t.Fatalf("a call that asks: %v", p)
		}
		return p["id"].(string)
	}
	approved, refused, cancelled := park(), park(), park()
	want(c.send("GET", "/v1/calls/"+approved, callerToken, nil), 202, "a parked call")
	wantError(c.send("GET", "/v1/calls/"+approved+"?wait=soon", callerToken, nil), 400, "invalid_request", "a bad wait")
	wantError(c.send("GET", "/v1/approvals", callerToken, nil), 403, "permission_denied", "approvals for a caller")
	list := want(c.send("GET", "/v1/approvals", approverToken, nil), 200, "approvals")
	if n := len(list["approvals"].([]any)); n != 3 {
		t.Fatalf("approvals: %d, want 3: %v", n, list)
	}
	wantError(c.send("POST", "/v1/approvals/"+approved, approverToken, map[string]any{"decision": "maybe"}), 400, "invalid_request", "a bad decision")
	wantError(c.send("POST", "/v1/approvals/"+approved, approverToken, map[string]any{"decision": "approve", "args_digest": "sha256:00"}), 409, "digest_mismatch", "a stale digest")
	if a := c.send("POST", "/v1/approvals/"+approved, approverToken, map[string]any{"decision": "approve"}); a.code != 200 && a.code != 202 {
		t.Fatalf("approve: HTTP %d %s", a.code, a.body)
	}
	wantError(c.send("POST", "/v1/approvals/"+approved, approverToken, map[string]any{"decision": "approve"}), 404, "not_found", "approved twice")
	want(c.send("POST", "/v1/approvals/"+refused, approverToken, map[string]any{"decision": "deny"}), 403, "deny")
	if a := want(c.send("DELETE", "/v1/calls/"+cancelled, callerToken, nil), 200, "cancel"); a["status"] != "cancelled" {
		t.Fatalf("cancel: %v", a)
	}
	wantError(c.send("DELETE", "/v1/calls/c_aaaaaaaaaaaaaaaaaaaaaaaaaa", callerToken, nil), 404, "not_found", "cancel an unknown call")
	want(c.send("GET", "/v1/calls/"+approved+"?wait=60s", callerToken, nil), 200, "the approved call")

	// Audit.
	want(c.send("GET", "/v1/audit?since=1h&limit=50", callerToken, nil), 200, "audit")
	wantError(c.send("GET", "/v1/audit?since=yesterday", callerToken, nil), 400, "invalid_request", "a bad since")

	// Workspaces.
	ws := "/v1/workspaces/"
	want(c.send("PUT", ws+"w1", approverToken, nil), 201, "create empty")
	want(c.send("PUT", ws+"w2", approverToken, tarGz(t, map[string]string{"README.md": "# w2\n", "src/a.go": "package a\n"}),
		"Content-Type", "application/gzip"), 201, "create from tar.gz")
	wantError(c.send("PUT", ws+"w3", approverToken, `{"git": {}}`, "Content-Type", "application/octet-stream"), 415, "invalid_request", "JSON as an archive")
	wantError(c.send("PUT", ws+"w3", approverToken, `{"gti": {}}`, "Content-Type", "application/json"), 400, "invalid_request", "a bad git source")
	wantError(c.send("PUT", ws+"-bad", approverToken, nil), 400, "invalid_request", "a bad name")
	want(c.send("GET", "/v1/workspaces", approverToken, nil), 200, "list")
	want(c.send("GET", ws+"w2", approverToken, nil), 200, "info")
	wantError(c.send("GET", ws+"nope", approverToken, nil), 404, "not_found", "an unknown workspace")
	want(c.send("POST", ws+"w1/files?path=lib", approverToken, tarGz(t, map[string]string{"b.txt": "bee\n"})), 200, "upload an archive")
	wantError(c.send("POST", ws+"w1/files", approverToken, nil), 400, "invalid_request", "upload nothing")
	want(c.send("PUT", ws+"w1/files/dir/a.txt", approverToken, "0123456789"), 200, "upload a file")
	wantError(c.send("PUT", ws+"w1/files/dir/c.txt", approverToken, "abc", "Content-Length", "-1"), 411, "invalid_request", "upload chunked")
	if f := c.send("GET", ws+"w1/files/dir/a.txt", approverToken, nil); f.code != 200 || string(f.body) != "0123456789" {
		t.Fatalf("download: HTTP %d %q", f.code, f.body)
	}
	if f := c.send("GET", ws+"w1/files/dir/a.txt", approverToken, nil, "Range", "bytes=2-4"); f.code != 206 || string(f.body) != "234" {
		t.Fatalf("download a range: HTTP %d %q", f.code, f.body)
	}
	wantError(c.send("GET", ws+"w1/files/dir/a.txt", approverToken, nil, "Range", "bytes=50-"), 416, "invalid_request", "a range past the end")
	wantError(c.send("GET", ws+"w1/files/none.txt", approverToken, nil), 404, "not_found", "download a missing file")
	want(c.send("GET", ws+"w1/archive", approverToken, nil), 200, "archive")
	want(c.send("POST", ws+"w1/snapshot", approverToken, map[string]any{"snapshot": "s1"}), 201, "snapshot")
	wantError(c.send("POST", ws+"w1/snapshot", approverToken, map[string]any{"snapshot": "s1"}), 409, "already_exists", "the same snapshot twice")
	want(c.send("POST", ws+"w1/fork", approverToken, map[string]any{"to": "w1b", "snapshot": "s1"}), 201, "fork")
	wantError(c.send("POST", ws+"w1/fork", approverToken, map[string]any{}), 400, "invalid_request", "fork to nowhere")
	want(c.send("POST", ws+"w1/restore", approverToken, map[string]any{"snapshot": "s1"}), 200, "restore")
	wantError(c.send("POST", ws+"w1/restore", approverToken, map[string]any{"snapshot": "s9"}), 404, "not_found", "restore a missing snapshot")
	want(c.send("DELETE", ws+"w1b", approverToken, nil), 200, "delete")
	want(c.send("PATCH", ws+"w2", approverToken, map[string]any{"image": ""}, "Content-Type", "application/json"), 200, "remove the default image")
	wantError(c.send("PATCH", ws+"w2", approverToken, map[string]any{"image": "registry.test/tools/python:3.12"}, "Content-Type", "application/json"),
		403, "policy_denied", "an image policy does not admit")
	wantError(c.send("PATCH", ws+"w2", approverToken, map[string]any{"image": "Not A Reference!"}, "Content-Type", "application/json"),
		422, "invalid_params", "an image that does not parse")
	wantError(c.send("PATCH", ws+"nope", approverToken, map[string]any{"image": ""}, "Content-Type", "application/json"), 404, "not_found", "change an unknown workspace")
	wantError(c.send("PATCH", ws+"w2", approverToken, map[string]any{}, "Content-Type", "application/json"), 400, "invalid_request", "no image")
	wantError(c.send("PATCH", ws+"w2", approverToken, `{"image": ""}`, "Content-Type", "text/plain"), 415, "invalid_request", "not JSON")

	// Every operation of the document answered at least once.
	for _, op := range c.contract.operations() {
		if len(c.contract.seen[op]) == 0 {
			t.Errorf("%s: no answer of it was checked against the document", op)
		}
	}
}

// TestOpenAPIContractTenantFull: a tenant at its quota of queued and running calls is refused with 429,
// Retry-After and an error body, as the document says.
func TestOpenAPIContractTenantFull(t *testing.T) {
	c := contractClient(t, startStack(t, "queue:\n  max_pending_per_tenant: 1\n"))
	busy := c.send("POST", "/v1/calls", callerToken, map[string]any{"tool": "run_shell", "args": map[string]any{"command": "sleep 60"}, "wait": false})
	if busy.code != http.StatusAccepted {
		t.Fatalf("a long call: HTTP %d %s", busy.code, busy.body)
	}
	full := c.send("POST", "/v1/calls", callerToken, map[string]any{"tool": "run_shell", "args": map[string]any{"command": "true"}})
	if e, _ := full.json(t)["error"].(map[string]any); full.code != http.StatusTooManyRequests || e["type"] != "quota_exceeded" || full.header.Get("Retry-After") == "" {
		t.Fatalf("a call over the quota: HTTP %d, Retry-After %q: %s", full.code, full.header.Get("Retry-After"), full.body)
	}
	if a := c.send("DELETE", "/v1/calls/"+busy.json(t)["id"].(string), callerToken, nil); a.code != http.StatusOK {
		t.Fatalf("cancel the long call: HTTP %d %s", a.code, a.body)
	}
}

// contractClient returns a client of the stack that checks every answer against the OpenAPI document
// the stack serves.
func contractClient(t *testing.T, s *stack) *client {
	t.Helper()
	resp, err := http.Get(s.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/openapi.json: HTTP %d, %v", resp.StatusCode, err)
	}
	return &client{t: t, url: s.URL, contract: newContract(t, raw)}
}

// tarGz returns a tar.gz archive of files (path to content).
func tarGz(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
