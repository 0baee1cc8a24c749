// Package console is the dispatcher's web console at /console: server-rendered pages over the HTTP API
// for the people in the loop (approvals, calls and their live output, workspaces). It owns sign-in, its
// session cookie, CSRF protection, the pages' security headers and their rendering; it owns no call
// logic: every page is one or more requests to the API handler it is given, in process, as the signed-in
// token, so the API's authentication, tenancy, policy and audit apply unchanged (docs/console.md).
package console

import (
	"context"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Prefix is the path the console is served under; cmd/dispatcher mounts Console at Prefix + "/".
const Prefix = "/console"

// Console serves the web console. It keeps no state between requests: the session is the browser's
// cookie, so any dispatcher replica serves any page.
type Console struct {
	cfg     Config
	metrics Gatherer
	client  *http.Client
	api     http.Handler
	pages   map[string]*template.Template
	mux     *http.ServeMux
	log     *slog.Logger
	// lookupHost resolves WorkerMetricsDNS's host (net.DefaultResolver's; tests replace it).
	lookupHost func(ctx context.Context, host string) ([]string, error)
}

// New returns the console over api, the dispatcher's HTTP API handler (the /v1 routes), which it calls
// in process with the signed-in token as a bearer token; metrics (nil: none) is the dispatcher's own
// metrics for the pool page, which also reads cfg.WorkerMetrics. log receives the console's own
// failures; it never receives a token.
func New(cfg Config, api http.Handler, metrics Gatherer, log *slog.Logger) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, metrics: metrics, client: &http.Client{}, api: api, log: log, mux: http.NewServeMux(),
		lookupHost: net.DefaultResolver.LookupHost}
	if err := c.parse(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

// ServeHTTP serves a console request with the console's security headers on every answer.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secure(w.Header())
	c.mux.ServeHTTP(w, r)
}

// csp is the Content-Security-Policy of every console answer: nothing but the dispatcher's own scripts,
// styles and images, no inline script or style, no framing, forms only to the console.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func secure(h http.Header) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer Chromium sends "Origin: null" with a form's POST,
	// which the CSRF check must refuse; console URLs carry no secret, and none leaves the origin.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

func (c *Console) routes() {
	assets, _ := fs.Sub(assetFS, "assets")
	static := http.StripPrefix(Prefix+"/assets/", http.FileServerFS(assets))
	c.mux.Handle("GET "+Prefix+"/assets/", static)
	c.mux.HandleFunc("GET "+Prefix+"/{$}", c.home)
	c.mux.HandleFunc("GET "+Prefix+"/signin", c.signinPage)
	c.mux.HandleFunc("POST "+Prefix+"/signin", c.signin)
	c.mux.HandleFunc("POST "+Prefix+"/signout", c.session(c.signout))
	c.mux.HandleFunc("GET "+Prefix+"/approvals", c.session(c.approvalsPage))
	c.mux.HandleFunc("GET "+Prefix+"/approvals/live", c.session(c.approvalsLive))
	c.mux.HandleFunc("POST "+Prefix+"/approvals/{id}", c.session(c.decide))
	c.mux.HandleFunc("GET "+Prefix+"/calls", c.session(c.callsPage))
	c.mux.HandleFunc("GET "+Prefix+"/calls/{id}", c.session(c.callPage))
	c.mux.HandleFunc("GET "+Prefix+"/calls/{id}/events", c.session(c.events))
	c.mux.HandleFunc("GET "+Prefix+"/calls/{id}/{stream}", c.session(c.outputPage))
	c.mux.HandleFunc("POST "+Prefix+"/calls/{id}/cancel", c.session(c.cancel))
	c.mux.HandleFunc("GET "+Prefix+"/workspaces", c.session(c.workspacesPage))
	c.mux.HandleFunc("GET "+Prefix+"/workspaces/{name}", c.session(c.workspacePage))
	c.mux.HandleFunc("GET "+Prefix+"/workspaces/{name}/files/{path...}", c.session(c.filePage))
	c.mux.HandleFunc("GET "+Prefix+"/workspaces/{name}/download/{path...}", c.session(c.download))
	c.mux.HandleFunc("GET "+Prefix+"/workspaces/{name}/archive", c.session(c.archive))
	c.mux.HandleFunc("POST "+Prefix+"/workspaces/{name}/snapshot", c.session(c.snapshot))
	c.mux.HandleFunc("GET "+Prefix+"/pool", c.session(c.poolPage))
	c.mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusNotFound, "no console page "+r.Method+" "+r.URL.Path+": start at "+Prefix+"/")
	})
}

// home sends a signed-in browser to the approvals, any other to sign-in.
func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	if _, ok := c.current(r); ok {
		http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
}
