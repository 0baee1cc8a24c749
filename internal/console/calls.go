package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// listedCall is one row of the calls list, folded from the audit log's events of one call.
type listedCall struct {
	ID        string
	Tool      string
	Workspace string
	Status    call.Status
	Rule      string
	Actor     string
	Accepted  time.Time
	Updated   time.Time
}

// callsFilter is the calls list's filter, from the page's query: since (a duration back from now, or
// an RFC 3339 time; default 1h), and exact status, tool and workspace.
type callsFilter struct {
	Since, Status, Tool, Workspace string
}

// maxLive is how many calls of a list that the audit log shows unfinished the page asks the API about.
const maxLive = 50

// callsList folds the tenant's audit events since f.Since into one row per call, newest first, with the
// current status of the calls the log shows unfinished, and keeps those f matches.
func (c *Console) callsList(r *http.Request, s *session, f callsFilter) ([]listedCall, error) {
	q := url.Values{"since": {f.Since}, "limit": {"10000"}}
	var log struct {
		Events []call.AuditEvent `json:"events"`
	}
	if err := c.get(r, s, "/v1/audit?"+q.Encode(), &log); err != nil {
		return nil, err
	}
	byID := map[string]*listedCall{}
	var rows []*listedCall
	for _, e := range log.Events {
		lc := byID[e.CallID]
		if lc == nil {
			lc = &listedCall{ID: e.CallID, Accepted: e.Time}
			byID[e.CallID] = lc
			rows = append(rows, lc)
		}
		if e.Time.Before(lc.Updated) {
			continue
		}
		lc.Tool, lc.Workspace, lc.Status, lc.Updated = e.Tool, e.Workspace, e.Status, e.Time
		if e.Rule != "" {
			lc.Rule = e.Rule
		}
		if e.Actor != "" {
			lc.Actor = e.Actor
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Accepted.After(rows[j].Accepted) })
	asked := 0
	out := []listedCall{}
	for _, lc := range rows {
		if !lc.Status.Terminal() && asked < maxLive {
			asked++
			var env call.Result
			if c.get(r, s, "/v1/calls/"+url.PathEscape(lc.ID), &env) == nil {
				lc.Status = env.Status
			}
		}
		if (f.Status == "" || string(lc.Status) == f.Status) && (f.Tool == "" || lc.Tool == f.Tool) && (f.Workspace == "" || lc.Workspace == f.Workspace) {
			out = append(out, *lc)
		}
	}
	return out, nil
}

func (c *Console) callsPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := callsFilter{Since: q.Get("since"), Status: q.Get("status"), Tool: q.Get("tool"), Workspace: q.Get("workspace")}
	if f.Since == "" {
		f.Since = "1h"
	}
	rows, err := c.callsList(r, s, f)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	statuses := []call.Status{call.StatusOK, call.StatusError, call.StatusTimeout, call.StatusDenied, call.StatusPendingApproval,
		call.StatusQueued, call.StatusRunning, call.StatusCancelled, call.StatusExpired, call.StatusLost}
	c.render(w, r, s, http.StatusOK, "calls", map[string]any{"Filter": f, "Calls": rows, "Statuses": statuses})
}

// callView is a call's page: its envelope, and the envelope in full as JSON.
type callView struct {
	R    call.Result
	JSON string
	Done bool
}

func (c *Console) callPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	res, b, err := c.envelope(r, s, http.MethodGet, "/v1/calls/"+url.PathEscape(id), nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	v := callView{R: *res}
	var buf bytes.Buffer
	_ = json.Indent(&buf, b, "", "  ")
	v.JSON, v.Done = visible(buf.String()), v.R.Status.Terminal()
	c.render(w, r, s, http.StatusOK, "call", v)
}

// events streams the call's Server-Sent Events from the API (GET /v1/calls/{id}/events) to the page's
// script, which cannot set an Authorization header on an EventSource: status changes, output as it is
// printed, then the result. A reconnecting EventSource's Last-Event-ID resumes it where it was cut.
func (c *Console) events(w http.ResponseWriter, r *http.Request, s *session) {
	req, err := apiRequest(r, s, http.MethodGet, "/v1/calls/"+url.PathEscape(r.PathValue("id"))+"/events", nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	req.Header.Set("Accept", "text/event-stream")
	c.proxy(w, r, s, req)
}

// cancel cancels the call (DELETE /v1/calls/{id}) and goes back to its page.
func (c *Console) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if _, _, err := c.envelope(r, s, http.MethodDelete, "/v1/calls/"+url.PathEscape(id), nil); err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"/calls/"+url.PathEscape(id), http.StatusSeeOther)
}

// outputPageBytes is how much of a stream one page of the full output shows.
const outputPageBytes = 256 << 10

// outputPage shows a finished command's full stdout or stderr by range (GET /v1/calls/{id}/{stream}),
// outputPageBytes at a time, as text.
func (c *Console) outputPage(w http.ResponseWriter, r *http.Request, s *session) {
	id, stream := r.PathValue("id"), r.PathValue("stream")
	if stream != call.StreamStdout && stream != call.StreamStderr {
		c.fail(w, r, s, http.StatusNotFound, fmt.Sprintf("a call's output stream is stdout or stderr, not %q", stream))
		return
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if r.URL.Query().Get("offset") == "" {
		offset, err = 0, nil
	}
	if err != nil || offset < 0 {
		c.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("offset=%q must be a byte offset, 0 or more", r.URL.Query().Get("offset")))
		return
	}
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}, "limit": {strconv.Itoa(outputPageBytes)}}
	code, b, err := c.do(r, s, http.MethodGet, "/v1/calls/"+url.PathEscape(id)+"/"+stream+"?"+q.Encode(), nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	if code/100 != 2 {
		c.failAPI(w, r, s, newAPIError(code, b))
		return
	}
	d := map[string]any{"ID": id, "Stream": stream, "Offset": offset, "Text": visibleHTML(string(b))}
	if offset > 0 {
		d["Prev"] = max(offset-outputPageBytes, 0)
	}
	if len(b) == outputPageBytes {
		d["Next"] = offset + int64(len(b))
	}
	c.render(w, r, s, http.StatusOK, "output", d)
}
