package console

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// workspaceInfo is a workspace as GET /v1/workspaces lists it.
type workspaceInfo struct {
	Name       string    `json:"name"`
	Bytes      int64     `json:"bytes"`
	Files      int64     `json:"files"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Snapshots  []struct {
		Name      string    `json:"name"`
		CreatedAt time.Time `json:"created_at"`
	} `json:"snapshots"`
}

func (c *Console) workspacesPage(w http.ResponseWriter, r *http.Request, s *session) {
	var list struct {
		Workspaces []workspaceInfo `json:"workspaces"`
	}
	if err := c.get(r, s, "/v1/workspaces", &list); err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	c.render(w, r, s, http.StatusOK, "workspaces", list.Workspaces)
}

// entry is one line of list_files' output: a directory, a file with its size, or a symlink.
type entry struct {
	Kind, Path, Name, Detail string
}

// list_files' lines (internal/tools/incontainer/list_files.go): a directory's path ends in "/" (and may
// say it is ignored), a file's is followed by its size, a symlink's by its target.
var (
	dirLine     = regexp.MustCompile(`^dir\s+(.+)/( \(ignored: .*\))?$`)
	fileLine    = regexp.MustCompile(`^file\s+(.+) \((\d+) bytes\)$`)
	symlinkLine = regexp.MustCompile(`^symlink\s+(.+?) -> (.*)$`)
)

// parseEntry reads one line of list_files' output; ok is false for a line that is not an entry (a note).
func parseEntry(line string) (e entry, ok bool) {
	if m := dirLine.FindStringSubmatch(line); m != nil {
		return entry{Kind: "dir", Path: m[1], Detail: strings.TrimSpace(strings.Trim(m[2], " ()"))}, true
	}
	if m := fileLine.FindStringSubmatch(line); m != nil {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		return entry{Kind: "file", Path: m[1], Detail: humanBytes(n)}, true
	}
	if m := symlinkLine.FindStringSubmatch(line); m != nil {
		return entry{Kind: "symlink", Path: m[1], Detail: "-> " + m[2]}, true
	}
	return entry{}, false
}

// browse lists the directory dir of workspace ws, one level, with the list_files tool (a call through
// POST /v1/calls, under the tenant's policy, which hides what it denies); lines that are not entries
// (notes) come back in notes.
func (c *Console) browse(r *http.Request, s *session, ws, dir string) ([]entry, []string, error) {
	args := map[string]any{"depth": 1, "limit": 1000}
	if dir != "" {
		args["path"] = dir
	}
	res, _, err := c.envelope(r, s, http.MethodPost, "/v1/calls", map[string]any{"tool": "list_files", "args": args, "workspace": ws})
	if err != nil {
		return nil, nil, err
	}
	if res.Status != call.StatusOK {
		msg := fmt.Sprintf("listing the directory ended %s", res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Message
		}
		return nil, []string{msg + " (call " + res.ID + ")"}, nil
	}
	var entries []entry
	var notes []string
	for _, line := range strings.Split(strings.TrimRight(res.Output, "\n"), "\n") {
		e, ok := parseEntry(line)
		if !ok {
			if strings.TrimSpace(line) != "" {
				notes = append(notes, line)
			}
			continue
		}
		e.Path = strings.TrimPrefix(e.Path, "./")
		e.Name = path.Base(e.Path)
		entries = append(entries, e)
	}
	return entries, notes, nil
}

func (c *Console) workspacePage(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PathValue("name")
	var info struct {
		Workspace workspaceInfo `json:"workspace"`
	}
	if err := c.get(r, s, "/v1/workspaces/"+url.PathEscape(name), &info); err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	dir := strings.Trim(r.URL.Query().Get("path"), "/")
	entries, notes, err := c.browse(r, s, name, dir)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	d := map[string]any{"W": info.Workspace, "Dir": dir, "Entries": entries, "Notes": notes, "Done": workspaceNote(r.URL.Query().Get("done"))}
	if dir != "" {
		d["Up"] = strings.TrimSuffix(path.Dir(dir), ".")
	}
	c.render(w, r, s, http.StatusOK, "workspace", d)
}

// fileViewBytes is how much of a file the file page shows; the download link gives it whole.
const fileViewBytes = 256 << 10

// filePage shows the start of a workspace file as text (GET /v1/workspaces/{name}/files/{path} with a
// Range), with a link to download it whole.
func (c *Console) filePage(w http.ResponseWriter, r *http.Request, s *session) {
	name, p := r.PathValue("name"), r.PathValue("path")
	req, err := apiRequest(r, s, http.MethodGet, "/v1/workspaces/"+url.PathEscape(name)+"/files/"+escapePath(p), nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=0-%d", fileViewBytes-1))
	rec := &answer{header: http.Header{}}
	c.api.ServeHTTP(rec, req)
	if rec.code/100 != 2 {
		c.failAPI(w, r, s, newAPIError(rec.code, rec.body.Bytes()))
		return
	}
	total := int64(rec.body.Len())
	if cr := rec.header.Get("Content-Range"); cr != "" { // bytes 0-N/TOTAL
		if i := strings.LastIndexByte(cr, '/'); i >= 0 {
			if n, err := strconv.ParseInt(cr[i+1:], 10, 64); err == nil {
				total = n
			}
		}
	}
	c.render(w, r, s, http.StatusOK, "file", map[string]any{"Workspace": name, "Path": p, "Dir": strings.TrimSuffix(path.Dir(p), "."),
		"Text": visibleHTML(rec.body.String()), "Shown": int64(rec.body.Len()), "Total": total, "Cut": int64(rec.body.Len()) < total})
}

// download streams a workspace file whole, as an attachment (never rendered by the browser).
func (c *Console) download(w http.ResponseWriter, r *http.Request, s *session) {
	name, p := r.PathValue("name"), r.PathValue("path")
	req, err := apiRequest(r, s, http.MethodGet, "/v1/workspaces/"+url.PathEscape(name)+"/files/"+escapePath(p), nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	w.Header().Set("Content-Disposition", "attachment; filename*=UTF-8''"+url.PathEscape(path.Base(p)))
	c.proxy(w, r, s, req)
}

// archive streams the workspace as a tar.gz (GET /v1/workspaces/{name}/archive).
func (c *Console) archive(w http.ResponseWriter, r *http.Request, s *session) {
	req, err := apiRequest(r, s, http.MethodGet, "/v1/workspaces/"+url.PathEscape(r.PathValue("name"))+"/archive", nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	c.proxy(w, r, s, req)
}

// snapshot takes a snapshot of the workspace (POST /v1/workspaces/{name}/snapshot; the form's name, or
// the API's snap-<time>), or, with restore, restores the named one (POST .../restore).
func (c *Console) snapshot(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PathValue("name")
	op, body := "snapshot", map[string]any{}
	if snap := strings.TrimSpace(r.PostFormValue("snapshot")); snap != "" {
		body["snapshot"] = snap
	}
	if r.PostFormValue("restore") != "" {
		op = "restore"
	}
	var res struct {
		Workspace workspaceInfo `json:"workspace"`
	}
	if err := c.json(r, s, http.MethodPost, "/v1/workspaces/"+url.PathEscape(name)+"/"+op, body, &res); err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	done := "snapshot"
	if op == "restore" {
		done = "restored:" + r.PostFormValue("snapshot")
	}
	http.Redirect(w, r, Prefix+"/workspaces/"+url.PathEscape(name)+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// escapePath escapes each segment of a workspace path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// workspaceNote is the note after a snapshot or restore, from the redirect's "done" ("snapshot", or
// "restored:<snapshot name>"), or "" for anything else: a link cannot put words of its own on the page.
func workspaceNote(done string) string {
	if done == "snapshot" {
		return "Snapshot taken."
	}
	if name, ok := strings.CutPrefix(done, "restored:"); ok && call.ValidateName("snapshot", name) == nil {
		return "Restored snapshot " + name + "."
	}
	return ""
}
