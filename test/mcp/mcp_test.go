package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// clients are the official TypeScript SDK clients and the protocol version each speaks here.
var clients = []struct{ kind, version string }{
	{"sdk1", "2025-11-25"},    // @modelcontextprotocol/sdk 1.x, what most MCP hosts embed today
	{"client2", "2025-11-25"}, // @modelcontextprotocol/client 2.x, negotiating the 2025 handshake
	{"client2", "2026-07-28"}, // @modelcontextprotocol/client 2.x, pinned to the stateless protocol
}

// TestOfficialClients runs every case of client/run.mjs with each client and checks what the client saw
// and what the dispatcher recorded. With -v it logs each client's transcript.
func TestOfficialClients(t *testing.T) {
	requireNode(t)
	s := startStack(t)
	for _, c := range clients {
		t.Run(c.kind+"/"+c.version, func(t *testing.T) {
			out := node(t, c.kind, c.version, s.URL, approverToken, callerToken)
			pretty, _ := json.MarshalIndent(out, "", "  ")
			t.Logf("transcript:\n%s", pretty)
			if out["version"] != c.version {
				t.Fatalf("the client negotiated %v, want %s", out["version"], c.version)
			}
			cases := out["cases"].(map[string]any)
			get := func(name string) map[string]any {
				r, _ := cases[name].(map[string]any)
				if r == nil || r["thrown"] != nil && name != "unknownTool" {
					t.Fatalf("case %s: %v", name, cases[name])
				}
				return r
			}
			workspace := "mcp-" + c.kind + "-" + c.version
			checkList(t, c.kind, get("list"))

			call := get("call")
			expect(t, "call", call, false, "hi\nsandbox\n", "ok")
			if st := structured(call); st["workspace"] != workspace {
				t.Errorf("call: workspace %v, want %s from the Toolpool-Workspace header", st["workspace"], workspace)
			}
			failure := get("toolFailure")
			expect(t, "toolFailure", failure, true, "oops", "error")
			if structured(failure)["exit_code"] != float64(3) {
				t.Errorf("toolFailure: %v, want exit_code 3", structured(failure))
			}
			expect(t, "denied", get("denied"), true, "denied by rule forbidden-commands", "denied")
			if u := get("unknownTool"); u["thrown"] == nil || !strings.Contains(u["thrown"].(string), "no_such_tool") {
				t.Errorf("unknownTool: %v, want a protocol error naming the tool", u)
			}
			expect(t, "badArgs", get("badArgs"), true, "command", "")
			expect(t, "badWorkspace", get("badWorkspace"), true, `workspace "../etc"`, "")

			approval := get("approval")
			expect(t, "approval", approval, false, "made", "ok")
			if p, _ := approval["prompts"].([]any); len(p) != 1 || !strings.Contains(p[0].(string), "mkdir -p approved") {
				t.Errorf("approval: prompts %v, want one showing the command", approval["prompts"])
			}
			checkAudited(t, s, structured(approval)["id"].(string), "approved", "acme/alice via mcp")

			checkProgress(t, get("progress"))
			checkCancelled(t, s, get("cancel"))

			// A caller token may not approve: the call waits in its token's default workspace, a person
			// approves it over REST, and a new connection fetches its result.
			pending := get("pending")
			expect(t, "pending", pending, false, "toolpool_get_result", "pending_approval")
			st := structured(pending)
			if p, _ := pending["prompts"].([]any); len(p) != 0 || st["workspace"] != "botspace" {
				t.Errorf("pending: prompts %v, workspace %v; want no prompt and the token's workspace botspace", p, st["workspace"])
			}
			id := st["id"].(string)
			if code, body := s.Do(t, http.MethodPost, "/v1/approvals/"+id, approverToken, map[string]any{"decision": "approve"}); code != http.StatusAccepted {
				t.Fatalf("approve %s over REST: HTTP %d %v", id, code, body)
			}
			got := node(t, c.kind, c.version, s.URL, callerToken, "get", id)
			t.Logf("get transcript: %v", got)
			expect(t, "get", got["cases"].(map[string]any)["get"].(map[string]any), false, "made later", "ok")
		})
	}
}

func structured(r map[string]any) map[string]any {
	st, _ := r["structured"].(map[string]any)
	return st
}

// expect checks a tool result: isError, a text that contains text, and the status of its structured
// content ("" for a result that has none).
func expect(t *testing.T, name string, r map[string]any, isError bool, text, status string) {
	t.Helper()
	got, _ := r["text"].(string)
	if r["isError"] != isError || !strings.Contains(got, text) {
		t.Errorf("%s: isError %v, text %q; want %v and %q", name, r["isError"], got, isError, text)
	}
	if st := structured(r); status != "" && (st == nil || st["status"] != status) {
		t.Errorf("%s: structured content %v, want status %s", name, st, status)
	}
}

// checkList checks the tenant's tools as the client listed them, and that both the MCP list and
// GET /v1/tools?format=mcp pass both SDKs' schemas.
func checkList(t *testing.T, kind string, list map[string]any) {
	t.Helper()
	hints := map[string]map[string]any{}
	for _, tl := range list["tools"].([]any) {
		m := tl.(map[string]any)
		if m["outputSchema"] != true {
			t.Errorf("%s has no output schema", m["name"])
		}
		hints[m["name"].(string)], _ = m["annotations"].(map[string]any)
	}
	for _, c := range []struct {
		tool                             string
		readOnly, destructive, openWorld bool
	}{
		{"read_file", true, false, false}, {"write_file", false, true, false}, {"run_shell", false, true, false},
		{"web_fetch", true, false, true}, {"toolpool_get_result", true, false, false},
	} {
		h := hints[c.tool]
		if h == nil || h["readOnlyHint"] != c.readOnly || h["destructiveHint"] != c.destructive || h["openWorldHint"] != c.openWorld {
			t.Errorf("%s: hints %v, want readOnly %v, destructive %v, openWorld %v", c.tool, h, c.readOnly, c.destructive, c.openWorld)
		}
	}
	for _, k := range []string{"mcpValid1", "mcpValid2", "restValid1", "restValid2"} {
		if list[k] != "ok" {
			t.Errorf("list %s: %v", k, list[k])
		}
	}
	var names []string
	for n := range hints {
		if n != "toolpool_get_result" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var rest []string
	for _, n := range list["restNames"].([]any) {
		rest = append(rest, n.(string))
	}
	slices.Sort(rest)
	if !slices.Equal(names, rest) || list["restResultType"] != "complete" || list["restCacheScope"] != "private" || list["restTTL"] != float64(0) {
		t.Errorf("REST list %v (%v, %v, %v), want MCP's tools %v as a whole private ListToolsResult", rest,
			list["restResultType"], list["restCacheScope"], list["restTTL"], names)
	}
}

// checkAudited checks that the audit log holds event for the call, by actor.
func checkAudited(t *testing.T, s *stack, id, event, actor string) {
	t.Helper()
	_, body := s.Do(t, http.MethodGet, "/v1/audit?since=1h", approverToken, nil)
	for _, e := range body["events"].([]any) {
		m := e.(map[string]any)
		if m["call_id"] == id && m["event"] == event {
			if m["actor"] != actor {
				t.Errorf("audit %s of %s: actor %v, want %s", event, id, m["actor"], actor)
			}
			return
		}
	}
	t.Errorf("the audit log has no %s event for %s: %v", event, id, body["events"])
}

// checkProgress checks the progress stream of a call that printed lines until released: queued, running,
// lines of its output while it ran, and ok last, with growing progress values.
func checkProgress(t *testing.T, r map[string]any) {
	t.Helper()
	expect(t, "progress", r, false, "released", "ok")
	msgs := r["progress"].([]any)
	var texts []string
	last := 0.0
	for _, m := range msgs {
		mm := m.(map[string]any)
		if p := mm["progress"].(float64); p <= last {
			t.Errorf("progress %v does not grow after %v", p, last)
		} else {
			last = p
		}
		texts = append(texts, mm["message"].(string))
	}
	running := slices.IndexFunc(texts, func(s string) bool { return strings.Contains(s, " running on mcp-worker") })
	output := slices.IndexFunc(texts, func(s string) bool { return strings.HasPrefix(s, "tick\n") })
	if len(texts) < 4 || !strings.Contains(texts[0], "queued") || running < 0 || output < running ||
		!strings.HasSuffix(texts[len(texts)-1], " ok") {
		t.Errorf("progress messages %q, want queued, running on mcp-worker, output (tick), ok", texts)
	}
}

// checkCancelled checks that the cancelled call ended cancelled: its container was killed.
func checkCancelled(t *testing.T, s *stack, r map[string]any) {
	t.Helper()
	id, _ := r["id"].(string)
	if id == "" || r["error"] == "" {
		t.Fatalf("cancel: %v, want the call's id and the client's error", r)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, res := s.Do(t, http.MethodGet, "/v1/calls/"+id+"?wait=30s", approverToken, nil)
		if res["status"] == "cancelled" {
			return
		}
		if res["status"] != "running" && res["status"] != "queued" || time.Now().After(deadline) {
			t.Fatalf("the cancelled call %s is %v, want cancelled: %v", id, res["status"], res)
		}
	}
}

// TestOfficialSchema validates what toolpool sends against the specification's own schema.json of each
// version: testdata/schema/<version>/schema.json, copied from the specification's repository (it is
// published nowhere else), or the copies in the directory TOOLPOOL_MCP_SCHEMA_DIR names.
func TestOfficialSchema(t *testing.T) {
	dir := os.Getenv("TOOLPOOL_MCP_SCHEMA_DIR")
	if dir == "" {
		dir = filepath.Join("testdata", "schema")
	}
	s := startStack(t)
	t.Run("tokens and origin", func(t *testing.T) { checkTokensAndOrigin(t, s) })
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			f, err := os.Open(filepath.Join(dir, version, "schema.json"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			doc, err := jsonschema.UnmarshalJSON(f)
			if err != nil {
				t.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			if err := c.AddResource("mcp.json", doc); err != nil {
				t.Fatal(err)
			}
			validate := func(what, def string, v any) {
				sch, err := c.Compile("mcp.json#/$defs/" + def)
				if err != nil {
					t.Fatal(err)
				}
				if err := sch.Validate(v); err != nil {
					t.Errorf("%s is not a valid %s of %s: %v", what, def, version, err)
				}
			}
			_, rest := s.Do(t, http.MethodGet, "/v1/tools?format=mcp", approverToken, nil)
			validate("GET /v1/tools?format=mcp", "ListToolsResult", rest)
			validate("tools/list", "ListToolsResult", rpc(t, s, version, "tools/list", map[string]any{}))
			validate("a denied tools/call", "CallToolResult", rpc(t, s, version, "tools/call", map[string]any{"name": "run_shell", "arguments": map[string]any{"command": "sudo ls"}}))
			// A call with a progress token: its progress notifications, output included, and its result.
			msgs := rpcStream(t, s, version, "tools/call", map[string]any{"name": "run_shell", "arguments": map[string]any{"command": "echo hi; sleep 0.5; echo there"},
				"_meta": map[string]any{"progressToken": "p1"}}, nil, nil)
			progress := 0
			for _, m := range msgs[:len(msgs)-1] {
				validate("a progress notification", "ProgressNotification", m)
				progress++
			}
			validate("tools/call", "CallToolResult", msgs[len(msgs)-1]["result"])
			if progress < 3 {
				t.Errorf("%d progress notifications, want queued, running, ok at least: %v", progress, msgs)
			}
			// A call that needs approval, from a client that can elicit: the prompt.
			asked := map[string]any{"name": "run_shell", "arguments": map[string]any{"command": "mkdir schema-" + version}}
			caps := map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}
			if version >= "2026-07-28" {
				validate("an approval prompt", "InputRequiredResult", rpcStream(t, s, version, "tools/call", asked, caps, nil)[0]["result"])
			} else {
				// The prompt comes on the call's stream; the answer, POSTed on its own, denies the call.
				prompts := 0
				msgs := rpcStream(t, s, version, "tools/call", asked, caps, func(session string, req map[string]any) {
					validate("an approval prompt", "ElicitRequest", req)
					prompts++
					answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req["id"], "result": map[string]any{"action": "decline"}})
					resp := post(t, s, version, session, answer)
					resp.Body.Close()
					if resp.StatusCode != http.StatusAccepted {
						t.Errorf("the answer to the prompt: HTTP %d, want 202", resp.StatusCode)
					}
				})
				res, _ := msgs[len(msgs)-1]["result"].(map[string]any)
				validate("a tools/call denied by the person", "CallToolResult", res)
				if st, _ := res["structuredContent"].(map[string]any); prompts != 1 || st["status"] != "denied" {
					t.Errorf("%d prompts, then %v; want one prompt and the call denied", prompts, res)
				}
			}
		})
	}
}

// rpc sends one stateless JSON-RPC request to /mcp at version and returns its result.
func rpc(t *testing.T, s *stack, version, method string, params map[string]any) any {
	t.Helper()
	msgs := rpcStream(t, s, version, method, params, nil, nil)
	return msgs[len(msgs)-1]["result"]
}

// rpcStream sends one JSON-RPC request to /mcp at version, as a client with capabilities caps, and
// returns the messages of its response stream up to the response. A request of the server's on the stream
// goes to answer (with the session id), which must not be nil then. A 2025-11-25 request carries the
// session id of an initialize with caps.
func rpcStream(t *testing.T, s *stack, version, method string, params, caps map[string]any, answer func(session string, req map[string]any)) []map[string]any {
	t.Helper()
	if caps == nil {
		caps = map[string]any{}
	}
	session := ""
	if version < "2026-07-28" {
		resp := post(t, s, version, "", request("initialize", map[string]any{"protocolVersion": version, "capabilities": caps,
			"clientInfo": map[string]any{"name": "raw", "version": "1"}}))
		resp.Body.Close()
		session = resp.Header.Get("Mcp-Session-Id")
	} else {
		meta, _ := params["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta["io.modelcontextprotocol/protocolVersion"] = version
		meta["io.modelcontextprotocol/clientCapabilities"] = caps
		meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "raw", "version": "1"}
		params["_meta"] = meta
	}
	resp := post(t, s, version, session, request(method, params))
	defer resp.Body.Close()
	var msgs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var msg map[string]any
		if err := json.Unmarshal([]byte(data), &msg); err != nil {
			t.Fatalf("%s at %s: an event that is not JSON: %s", method, version, data)
		}
		msgs = append(msgs, msg)
		switch {
		case msg["error"] != nil:
			t.Fatalf("%s at %s: %v", method, version, msg["error"])
		case msg["id"] != nil && msg["method"] != nil:
			if answer == nil {
				t.Fatalf("%s at %s: an unexpected request on the stream: %v", method, version, msg)
			}
			answer(session, msg)
		case msg["id"] != nil:
			return msgs
		}
	}
	t.Fatalf("%s at %s: HTTP %d and no response in the stream (%v)", method, version, resp.StatusCode, msgs)
	return nil
}

// request is a JSON-RPC request with id 1.
func request(method string, params map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	return b
}

// post sends one JSON-RPC message to /mcp with the approver's token; the caller closes the response's
// body.
func post(t *testing.T, s *stack, version, session string, body []byte) *http.Response {
	t.Helper()
	var msg struct {
		Method string         `json:"method"`
		Params map[string]any `json:"params"`
	}
	_ = json.Unmarshal(body, &msg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/mcp", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+approverToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	if version >= "2026-07-28" && msg.Method != "" {
		req.Header.Set("Mcp-Method", msg.Method)
		if name, ok := msg.Params["name"].(string); ok {
			req.Header.Set("Mcp-Name", name)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// checkTokensAndOrigin checks the real dispatcher's /mcp: the REST API's tokens, and the Origin check.
func checkTokensAndOrigin(t *testing.T, s *stack) {
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	for _, c := range []struct {
		name, token, origin string
		code                int
		want                string
	}{
		{"no token", "", "", http.StatusUnauthorized, ""},
		{"unknown token", "nope", "", http.StatusUnauthorized, ""},
		{"a token, no origin", callerToken, "", http.StatusOK, `"serverInfo"`},
		{"an allowed origin", callerToken, "https://app.example.com", http.StatusOK, `"serverInfo"`},
		{"a foreign origin", callerToken, "https://evil.example", http.StatusForbidden, "mcp.allowed_origins"},
	} {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/mcp", strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: HTTP %d %s; want %d with %q", c.name, resp.StatusCode, body, c.code, c.want)
		}
	}
}
