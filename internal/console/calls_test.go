package console

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fakeCalls adds the calls API to f (newFakeAPI): an audit log of three calls, their envelopes, cancel, the events
// stream and the range read.
func (f *fakeAPI) fakeCalls() {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	f.mux.HandleFunc("GET /v1/audit", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("since") != "1h" && r.URL.Query().Get("since") != "24h" {
			writeTestJSON(w, 400, map[string]any{"error": map[string]string{"type": "invalid_request", "message": "since=" + r.URL.Query().Get("since")}})
			return
		}
		ev := func(sec int, event, id, tool, ws, status string) map[string]any {
			return map[string]any{"time": t0.Add(time.Duration(sec) * time.Second), "event": event, "tenant": "acme", "call_id": id, "tool": tool, "workspace": ws, "status": status}
		}
		writeTestJSON(w, 200, map[string]any{"events": []map[string]any{
			ev(0, "accepted", "c_a", "run_shell", "ws1", "queued"), ev(5, "finished", "c_a", "run_shell", "ws1", "ok"),
			ev(10, "accepted", "c_b", "read_file", "ws2", "queued"), // still running: its envelope says so
			ev(20, "accepted", "c_c", "run_shell", "ws1", "pending_approval"), ev(30, "rejected", "c_c", "run_shell", "ws1", "denied"),
		}})
	})
	f.mux.HandleFunc("GET /v1/calls/{id}/stdout", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "from %s: <i>\x1b[1m", r.URL.Query().Get("offset"))
	})
	f.mux.HandleFunc("GET /v1/calls/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "id: 0.0\nevent: status\ndata: {\"status\":\"running\",\"last\":%q}\n\n", r.Header.Get("Last-Event-ID"))
	})
	f.mux.HandleFunc("DELETE /v1/calls/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.decided = append(f.decided, map[string]any{"cancel": r.PathValue("id")})
		f.mu.Unlock()
		writeTestJSON(w, 202, map[string]any{"id": r.PathValue("id"), "status": "running", "cancel_requested": true})
	})
	f.mux.HandleFunc("GET /v1/calls/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		switch id {
		case "c_b":
			writeTestJSON(w, 202, map[string]any{"id": id, "tenant": "acme", "tool": "read_file", "workspace": "ws2", "status": "running"})
		case "c_c":
			writeTestJSON(w, 403, map[string]any{"id": id, "tenant": "acme", "tool": "run_shell", "status": "denied",
				"decision": map[string]any{"action": "ask", "rule": "mutating-commands", "reason": "it changes things"}})
		case "c_new", "c_old":
			writeTestJSON(w, 202, map[string]any{"id": id, "tenant": "acme", "status": "pending_approval"})
		case "c_a":
			writeTestJSON(w, 200, map[string]any{"id": id, "tenant": "acme", "tool": "run_shell", "workspace": "ws1", "status": "ok", "exit_code": 0,
				"output": hostile, "stderr": "warn\x1b[0m", "timing": map[string]any{"run_ms": 12, "warm": true},
				"streams": map[string]any{"stdout": map[string]any{"bytes": 5 << 20, "kept": 5 << 20}}})
		default:
			writeTestJSON(w, 404, map[string]any{"error": map[string]string{"type": "not_found", "message": "no call " + id}})
		}
	})
}

func TestCallsList(t *testing.T) {
	_, b := newConsole(t)
	b.signIn(callerToken)
	_, page := b.do("GET", "/console/calls", nil, nil)
	a, bb, c := strings.Index(page, `href="/console/calls/c_a"`), strings.Index(page, `href="/console/calls/c_b"`), strings.Index(page, `href="/console/calls/c_c"`)
	if a < 0 || bb < 0 || c < 0 || !(c < bb && bb < a) {
		t.Fatalf("want c_c, c_b, c_a, newest first:\n%s", page)
	}
	for _, want := range []string{`<td class="status">running</td>`, `<td class="status">denied</td>`, `<td class="status">ok</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the list lacks %s (a call the log shows unfinished takes its envelope's status)", want)
		}
	}
	for q, want := range map[string][]string{
		"status=denied":            {"c_c"},
		"tool=run_shell":           {"c_a", "c_c"},
		"workspace=ws2":            {"c_b"},
		"workspace=ws1&status=ok":  {"c_a"},
		"since=24h&tool=read_file": {"c_b"},
		"status=timeout":           {},
	} {
		_, page := b.do("GET", "/console/calls?"+q, nil, nil)
		for _, id := range []string{"c_a", "c_b", "c_c"} {
			listed := strings.Contains(page, `href="/console/calls/`+id+`"`)
			wanted := strings.Contains(strings.Join(want, " "), id)
			if listed != wanted {
				t.Errorf("?%s: %s listed %v, want %v", q, id, listed, wanted)
			}
		}
	}
	resp, page := b.do("GET", "/console/calls?since=forever", nil, nil)
	if resp.StatusCode != 400 || !strings.Contains(page, "since=forever") {
		t.Errorf("a bad since answered %d without the API's message:\n%s", resp.StatusCode, page)
	}
}

func TestCallPage(t *testing.T) {
	api, b := newConsole(t)
	csrf := b.signIn(callerToken)

	_, page := b.do("GET", "/console/calls/c_a", nil, nil)
	for _, want := range []string{`id="status" aria-live="polite">ok<`, "run 12 ms", "warm", `href="/console/calls/c_a/stdout"`, "5.0 MiB printed",
		`&lt;script&gt;alert(1)&lt;/script&gt;`, `<span class="ctl">\x1b</span>[31mred`, `warn<span class="ctl">\x1b</span>[0m`} {
		if !strings.Contains(page, want) {
			t.Errorf("the finished call's page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "data-follow") || strings.Contains(page, "cancel-form") {
		t.Errorf("the finished call's page carries its output as markup, follows it or offers cancel:\n%s", page)
	}
	_, page = b.do("GET", "/console/calls/c_b", nil, nil)
	if !strings.Contains(page, `data-follow="/console/calls/c_b/events"`) || !strings.Contains(page, `id="cancel-form"`) || !strings.Contains(page, `id="live-output"`) {
		t.Errorf("the running call's page does not follow its output or offer cancel:\n%s", page)
	}
	resp, page := b.do("GET", "/console/calls/c_c", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(page, "mutating-commands") || !strings.Contains(page, ">denied<") {
		t.Errorf("a denied call's page (HTTP %d) does not show its envelope:\n%s", resp.StatusCode, page)
	}
	if resp, page = b.do("GET", "/console/calls/c_zzz", nil, nil); resp.StatusCode != 404 || !strings.Contains(page, "no call c_zzz") {
		t.Errorf("an unknown call answered %d without the API's message", resp.StatusCode)
	}

	// Cancel: a state change, CSRF first.
	if resp, _ = b.do("POST", "/console/calls/c_b/cancel", url.Values{}, nil); resp.StatusCode != 403 {
		t.Errorf("cancel without the CSRF token answered %d, want 403", resp.StatusCode)
	}
	resp, _ = b.do("POST", "/console/calls/c_b/cancel", url.Values{"csrf": {csrf}}, nil)
	if resp.StatusCode != 303 || resp.Header.Get("Location") != "/console/calls/c_b" {
		t.Errorf("cancel answered %d to %q, want 303 to the call's page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if d := api.decisions(); len(d) != 1 || d[0]["cancel"] != "c_b" {
		t.Errorf("the API got %v, want one cancel of c_b", d)
	}

	// The range read, as text.
	_, page = b.do("GET", "/console/calls/c_a/stdout?offset=7", nil, nil)
	if !strings.Contains(page, `from 7: &lt;i&gt;<span class="ctl">\x1b</span>[1m`) || !strings.Contains(page, "?offset=0") {
		t.Errorf("the range page does not show the bytes as text with a way back:\n%s", page)
	}
	for _, bad := range []string{"/console/calls/c_a/stdin", "/console/calls/c_a/stdout?offset=-1", "/console/calls/c_a/stdout?offset=x"} {
		if resp, _ := b.do("GET", bad, nil, nil); resp.StatusCode != 404 && resp.StatusCode != 400 {
			t.Errorf("%s answered %d, want 400 or 404", bad, resp.StatusCode)
		}
	}
}

// TestEvents: the page's EventSource gets the API's stream as it is, resumed from Last-Event-ID.
func TestEvents(t *testing.T) {
	_, b := newConsole(t)
	b.signIn(callerToken)
	req, _ := http.NewRequest("GET", b.base+"/console/calls/c_b/events", nil)
	req.Header.Set("Last-Event-ID", "10.2")
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get("Content-Security-Policy") != csp {
		t.Fatalf("events: Content-Type %q, CSP %q", ct, resp.Header.Get("Content-Security-Policy"))
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 3 || lines[1] != "event: status" || !strings.Contains(lines[2], `"last":"10.2"`) {
		t.Fatalf("events: %q, want the API's status event, resumed at 10.2", lines)
	}
	// Signed out, the stream is not served.
	resp2, err := http.Get(b.base + "/console/calls/c_b/events")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.Request.URL.Path != "/console/signin" {
		t.Fatalf("a signed-out EventSource ended at %s, want the sign-in page", resp2.Request.URL.Path)
	}
}
