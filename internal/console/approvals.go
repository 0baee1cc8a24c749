package console

import (
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// approval is one call waiting for approval, as GET /v1/approvals lists it, with what the page shows.
type approval struct {
	ID         string          `json:"id"`
	Tool       string          `json:"tool"`
	Workspace  string          `json:"workspace"`
	Args       json.RawMessage `json:"args"`
	ArgsDigest string          `json:"args_digest"`
	Rule       string          `json:"rule"`
	Reason     string          `json:"reason"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  time.Time       `json:"expires_at"`

	Tenant  string        `json:"-"`
	Pretty  string        `json:"-"` // the arguments, indented JSON
	Command template.HTML `json:"-"` // a command line argument, highlighted (highlightShell)
	Prefix  string        `json:"-"` // the argv prefix offered for approve always: the command's first word
}

// approvalsData is the approvals page's data: what waits, oldest first, or why this token sees none.
type approvalsData struct {
	Approver  bool
	Approvals []approval
	Done      string // what the last decision did, from the redirect after it
}

// approvals lists what waits for s's tenant, oldest first; a token that may not approve gets
// approver=false and no list.
func (c *Console) approvals(r *http.Request, s *session) (approvalsData, error) {
	var list struct {
		Approvals []approval `json:"approvals"`
	}
	err := c.get(r, s, "/v1/approvals", &list)
	if isAPIError(err, http.StatusForbidden) {
		return approvalsData{}, nil
	}
	if err != nil {
		return approvalsData{}, err
	}
	sort.SliceStable(list.Approvals, func(i, j int) bool { return list.Approvals[i].CreatedAt.Before(list.Approvals[j].CreatedAt) })
	for i := range list.Approvals {
		a := &list.Approvals[i]
		a.Pretty = visible(pretty(a.Args))
		var args struct {
			Command string `json:"command"`
		}
		if json.Unmarshal(a.Args, &args) == nil && args.Command != "" {
			a.Command = highlightShell(args.Command)
			if f := strings.Fields(args.Command); len(f) > 0 {
				a.Prefix = f[0]
			}
		}
		var env struct {
			Tenant string `json:"tenant"`
		}
		if c.get(r, s, "/v1/calls/"+url.PathEscape(a.ID), &env) == nil {
			a.Tenant = env.Tenant
		}
	}
	return approvalsData{Approver: true, Approvals: list.Approvals}, nil
}

func (c *Console) approvalsPage(w http.ResponseWriter, r *http.Request, s *session) {
	d, err := c.approvals(r, s)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	d.Done = decidedNote(r.URL.Query().Get("done"))
	c.render(w, r, s, http.StatusOK, "approvals", d)
}

// approvalsLive is the approvals list alone, which the page's script fetches every few seconds to show
// new asks without a reload.
func (c *Console) approvalsLive(w http.ResponseWriter, r *http.Request, s *session) {
	d, err := c.approvals(r, s)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	c.renderBlock(w, r, s, http.StatusOK, "approvals", "list", d)
}

// decide posts the person's decision: decision approve or deny, the digest of the arguments shown (so
// that changed arguments are refused), with a deny the reason typed (told to the caller), and for
// approve always the argv prefix (words separated by spaces) to allow from now on.
func (c *Console) decide(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	body := map[string]any{"decision": r.PostFormValue("decision"), "args_digest": r.PostFormValue("args_digest")}
	if reason := strings.TrimSpace(r.PostFormValue("reason")); reason != "" && body["decision"] == "deny" {
		body["reason"] = reason
	}
	if r.PostFormValue("always") != "" {
		body["decision"], body["always"] = "approve", true
		body["argv_prefix"] = strings.Fields(r.PostFormValue("argv_prefix"))
	}
	res, _, err := c.envelope(r, s, http.MethodPost, "/v1/approvals/"+url.PathEscape(id), body)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"/approvals?done="+url.QueryEscape(id+" "+string(res.Status)), http.StatusSeeOther)
}

// decidedNote is the note after a decision, from the redirect's "done" ("<call id> <status>"), or ""
// when done is not that: a link cannot put words of its own on the page.
func decidedNote(done string) string {
	id, status, ok := strings.Cut(done, " ")
	if !ok || !call.ValidID(id) {
		return ""
	}
	switch call.Status(status) {
	case call.StatusQueued, call.StatusDenied, call.StatusRunning, call.StatusOK, call.StatusError, call.StatusTimeout, call.StatusCancelled:
		return done
	}
	return ""
}
