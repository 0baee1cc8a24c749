package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fakeWorkspaces adds the workspace API to f: workspace ws1 with one snapshot, list_files through
// POST /v1/calls, files by range, the archive and snapshots.
func (f *fakeAPI) fakeWorkspaces() {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	ws := map[string]any{"name": "ws1", "bytes": 3 << 20, "files": 4, "created_at": t0, "last_used_at": t0, "expires_at": t0.Add(24 * time.Hour),
		"snapshots": []map[string]any{{"name": "before", "created_at": t0}}}
	f.mux.HandleFunc("GET /v1/workspaces", func(w http.ResponseWriter, r *http.Request) {
		writeTestJSON(w, 200, map[string]any{"workspaces": []any{ws}})
	})
	f.mux.HandleFunc("GET /v1/workspaces/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "ws1" {
			writeTestJSON(w, 404, map[string]any{"error": map[string]string{"type": "not_found", "message": "no workspace " + r.PathValue("name")}})
			return
		}
		writeTestJSON(w, 200, map[string]any{"workspace": ws})
	})
	f.mux.HandleFunc("POST /v1/calls", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Tool      string         `json:"tool"`
			Args      map[string]any `json:"args"`
			Workspace string         `json:"workspace"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.decided = append(f.decided, map[string]any{"tool": req.Tool, "args": req.Args, "workspace": req.Workspace})
		f.mu.Unlock()
		out := "dir      .git/ (ignored: not listed; set include_ignored to see inside)\ndir      src/\nfile     a (1).txt (7 bytes)\nfile     <b>x\x1b.md (3 bytes)\nsymlink  l -> /etc/passwd\n[1 entries not listed: policy denies them (secrets and keys)]"
		if req.Args["path"] == "src" {
			out = "file     src/main.go (73 bytes)"
		}
		writeTestJSON(w, 200, map[string]any{"id": "c_ls", "status": "ok", "output": out})
	})
	f.mux.HandleFunc("GET /v1/workspaces/{name}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			w.Header().Set("Content-Range", "bytes 0-9/1000000")
			w.WriteHeader(206)
			fmt.Fprint(w, "<i>\x1b[1mhi")
			return
		}
		fmt.Fprint(w, "whole file "+r.PathValue("path"))
	})
	f.mux.HandleFunc("GET /v1/workspaces/{name}/archive", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "ws1" {
			writeTestJSON(w, 404, map[string]any{"error": map[string]string{"type": "not_found", "message": "no workspace " + r.PathValue("name")}})
			return
		}
		w.Header().Set("Content-Type", "application/gzip")
		w.Header().Set("Content-Disposition", `attachment; filename="ws1.tar.gz"`)
		fmt.Fprint(w, "\x1f\x8bGZ")
	})
	for _, op := range []string{"snapshot", "restore"} {
		f.mux.HandleFunc("POST /v1/workspaces/{name}/"+op, func(w http.ResponseWriter, r *http.Request) {
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			body["op"] = op
			f.mu.Lock()
			f.decided = append(f.decided, body)
			f.mu.Unlock()
			writeTestJSON(w, 201, map[string]any{"workspace": ws, "call_id": "c_snap"})
		})
	}
}

func TestWorkspaces(t *testing.T) {
	api, b := newConsole(t)
	csrf := b.signIn(callerToken)
	_, page := b.do("GET", "/console/workspaces", nil, nil)
	for _, want := range []string{`href="/console/workspaces/ws1"`, "3.0 MiB", "2026-11-28 10:00:00 UTC"} {
		if !strings.Contains(page, want) {
			t.Errorf("the workspaces list lacks %q", want)
		}
	}
	_, page = b.do("GET", "/console/workspaces/ws1", nil, nil)
	for _, want := range []string{`href="/console/workspaces/ws1?path=src"`, `href="/console/workspaces/ws1/files/a%20%281%29.txt">a (1).txt</a>`,
		`&lt;b&gt;x<span class="ctl">\x1b</span>.md`, "-&gt; /etc/passwd", "1 entries not listed", "before", `value="before"`,
		`href="/console/workspaces/ws1/archive"`, "ignored: not listed"} {
		if !strings.Contains(page, want) {
			t.Errorf("the workspace page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "<b>x") {
		t.Error("a file name is markup on the page")
	}
	_, page = b.do("GET", "/console/workspaces/ws1?path=src", nil, nil)
	if !strings.Contains(page, `href="/console/workspaces/ws1/files/src/main.go">main.go</a>`) || !strings.Contains(page, "Up to the top") {
		t.Errorf("browsing src:\n%s", page)
	}
	d := api.decisions()
	if len(d) != 2 || d[0]["tool"] != "list_files" || d[1]["args"].(map[string]any)["path"] != "src" || d[1]["workspace"] != "ws1" {
		t.Errorf("the API got %v, want two list_files calls on ws1, the second of src", d)
	}

	resp, page := b.do("GET", "/console/workspaces/ws1/files/src/main.go", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(page, `&lt;i&gt;<span class="ctl">\x1b</span>[1mhi`) || !strings.Contains(page, "Showing the first 9 B of 976.6 KiB") ||
		!strings.Contains(page, `href="/console/workspaces/ws1/download/src/main.go"`) {
		t.Errorf("the file page (HTTP %d):\n%s", resp.StatusCode, page)
	}
	resp, page = b.do("GET", "/console/workspaces/ws1/download/src/main.go", nil, nil)
	if page != "whole file src/main.go" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") {
		t.Errorf("download: %q, Content-Disposition %q", page, resp.Header.Get("Content-Disposition"))
	}
	resp, page = b.do("GET", "/console/workspaces/ws1/archive", nil, nil)
	if page != "\x1f\x8bGZ" || resp.Header.Get("Content-Type") != "application/gzip" || resp.Header.Get("Content-Security-Policy") != csp {
		t.Errorf("archive: %q %v", page, resp.Header)
	}
	resp, page = b.do("GET", "/console/workspaces/nope/archive", nil, nil)
	if resp.StatusCode != 404 || !strings.Contains(page, "no workspace nope") || resp.Header.Get("Content-Disposition") != "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("a refused archive answered %d %v:\n%s", resp.StatusCode, resp.Header, page)
	}

	if resp, _ = b.do("POST", "/console/workspaces/ws1/snapshot", url.Values{"snapshot": {"x"}}, nil); resp.StatusCode != 403 {
		t.Errorf("a snapshot without the CSRF token answered %d", resp.StatusCode)
	}
	resp, _ = b.do("POST", "/console/workspaces/ws1/snapshot", url.Values{"csrf": {csrf}, "snapshot": {"mine"}}, nil)
	if resp.StatusCode != 303 || !strings.HasSuffix(resp.Header.Get("Location"), "?done=snapshot") {
		t.Errorf("snapshot answered %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, _ = b.do("POST", "/console/workspaces/ws1/snapshot", url.Values{"csrf": {csrf}, "snapshot": {"before"}, "restore": {"1"}}, nil)
	if _, page := b.do("GET", resp.Header.Get("Location"), nil, nil); !strings.Contains(page, "Restored snapshot before.") {
		t.Errorf("after a restore the page does not say so")
	}
	for _, forged := range []string{"?done=Call+evil.example", "?done=restored:..%2Fx+call+us"} {
		if _, page := b.do("GET", "/console/workspaces/ws1"+forged, nil, nil); strings.Contains(page, `class="done"`) {
			t.Errorf("the workspace page shows a note from its URL %s", forged)
		}
	}
	d = api.decisions()
	if len(d) < 4 || d[2]["op"] != "snapshot" || d[2]["snapshot"] != "mine" || d[3]["op"] != "restore" || d[3]["snapshot"] != "before" {
		t.Errorf("the API got %v, want snapshot mine then restore before", d[2:])
	}
}
