package console

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests drive the console over a fake API (fakeAPI) that speaks the API's wire shapes; the real
// dispatcher, NATS, containerd and a real browser are test/console's.

const (
	approverToken = "tok-approver"
	callerToken   = "tok-caller"
	hostile       = "<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[31mred\x1b[0m\x07"
)

type fakeAPI struct {
	mu      sync.Mutex
	decided []map[string]any // bodies of POST /v1/approvals/{id}
	authz   []string         // Authorization headers seen
	mux     *http.ServeMux
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{mux: http.NewServeMux()}
	f.mux.HandleFunc("GET /v1/approvals", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+approverToken {
			writeTestJSON(w, 403, map[string]any{"error": map[string]string{"type": "permission_denied", "message": "this token may not approve calls"}})
			return
		}
		args, _ := json.Marshal(map[string]string{"command": "mkdir build && echo '" + hostile + "' > x"})
		now := time.Now()
		writeTestJSON(w, 200, map[string]any{"approvals": []map[string]any{
			{"id": "c_new", "tool": "run_shell", "workspace": "ws", "args": json.RawMessage(args), "args_digest": "sha256:aa",
				"rule": "mutating-commands", "reason": "it changes the workspace", "created_at": now, "expires_at": now.Add(time.Hour)},
			{"id": "c_old", "tool": "write_file", "workspace": "ws", "args": json.RawMessage(`{"path":"a","content":"b"}`), "args_digest": "sha256:bb",
				"rule": "writes", "reason": "it writes", "created_at": now.Add(-time.Minute), "expires_at": now.Add(time.Hour)},
		}})
	})
	f.mux.HandleFunc("POST /v1/approvals/{id}", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.decided = append(f.decided, body)
		f.mu.Unlock()
		if body["decision"] == "deny" {
			writeTestJSON(w, 403, map[string]any{"id": r.PathValue("id"), "status": "denied"})
			return
		}
		writeTestJSON(w, 202, map[string]any{"id": r.PathValue("id"), "status": "queued"})
	})
	f.fakeCalls()
	f.fakeWorkspaces()
	return f
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.authz = append(f.authz, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if a := r.Header.Get("Authorization"); a != "Bearer "+approverToken && a != "Bearer "+callerToken {
		writeTestJSON(w, 401, map[string]any{"error": map[string]string{"type": "unauthorized", "message": "the bearer token is not known"}})
		return
	}
	if r.Header.Get("Cookie") != "" {
		writeTestJSON(w, 400, map[string]any{"error": map[string]string{"type": "invalid_request", "message": "a cookie reached the API"}})
		return
	}
	f.mux.ServeHTTP(w, r)
}

func (f *fakeAPI) decisions() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.decided...)
}

func writeTestJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// browser is a client with a cookie jar that does not follow redirects, like a person's browser on
// the console's pages (it sends Origin on POST, as browsers do).
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newConsole(t *testing.T) (*fakeAPI, *browser) {
	t.Helper()
	api := newFakeAPI()
	con, err := New(DefaultConfig(), api, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return api, &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values, header map[string]string) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

var hiddenCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs the browser in with token and returns the CSRF token of its pages.
func (b *browser) signIn(token string) string {
	b.t.Helper()
	_, page := b.do("GET", "/console/signin", nil, nil)
	m := hiddenCSRF.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("the sign-in page has no CSRF field:\n%s", page)
	}
	resp, _ := b.do("POST", "/console/signin", url.Values{"csrf": {m[1]}, "token": {token}}, map[string]string{"Origin": b.base})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/approvals" {
		b.t.Fatalf("sign in: HTTP %d to %q, want 303 to /console/approvals", resp.StatusCode, resp.Header.Get("Location"))
	}
	_, page = b.do("GET", "/console/approvals", nil, nil)
	m = hiddenCSRF.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("the approvals page has no CSRF field:\n%s", page)
	}
	return m[1]
}

func TestSignIn(t *testing.T) {
	api, b := newConsole(t)
	resp, _ := b.do("GET", "/console/approvals", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/signin" {
		t.Fatalf("signed out: GET approvals answered %d to %q, want 303 to the sign-in page", resp.StatusCode, resp.Header.Get("Location"))
	}
	_, page := b.do("GET", "/console/signin", nil, nil)
	csrf := hiddenCSRF.FindStringSubmatch(page)[1]

	// Without the sign-in page's CSRF value (another site's form), nothing is checked or set.
	resp, _ = b.do("POST", "/console/signin", url.Values{"token": {approverToken}, "csrf": {"forged"}}, nil)
	if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Fatalf("a sign-in without the form's CSRF value answered %d with cookies %v, want 403 and none", resp.StatusCode, resp.Cookies())
	}
	if len(api.authz) != 0 {
		t.Fatalf("a forged sign-in reached the API: %v", api.authz)
	}
	// An unknown token goes back to the form, saying so, and is never in the URL.
	resp, _ = b.do("POST", "/console/signin", url.Values{"token": {"wrong-token"}, "csrf": {csrf}}, nil)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(loc, "wrong-token") {
		t.Fatalf("an unknown token answered %d to %q, want 303 to the form, without the token", resp.StatusCode, loc)
	}
	if _, page := b.do("GET", loc, nil, nil); !strings.Contains(page, "this token is not known to the dispatcher") {
		t.Fatalf("the form after an unknown token does not say why:\n%s", page)
	}
	// The form shows only its own messages, never words a link brings.
	if _, page := b.do("GET", "/console/signin?error=Send+your+token+to+evil.example", nil, nil); strings.Contains(page, "evil.example") {
		t.Fatal("the sign-in form shows text from its URL")
	}
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie && c.MaxAge >= 0 {
			t.Fatalf("an unknown token got a session cookie: %v", c)
		}
	}

	csrf = b.signIn(approverToken)
	if csrf != csrfFor(approverToken) || strings.Contains(csrf, approverToken) {
		t.Fatalf("the pages' CSRF token is %q, want the token's HMAC", csrf)
	}
	u, _ := url.Parse(b.base + "/console/")
	var session *http.Cookie
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == sessionCookie {
			session = c
		}
	}
	if session == nil {
		t.Fatal("no session cookie after signing in")
	}
	// The jar does not keep the attributes: check them on a fresh sign-in's Set-Cookie.
	_, page = b.do("GET", "/console/signin", nil, nil)
	resp, _ = b.do("POST", "/console/signin", url.Values{"token": {callerToken}, "csrf": {hiddenCSRF.FindStringSubmatch(page)[1]}}, nil)
	var set *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			set = c
		}
	}
	if set == nil || !set.HttpOnly || set.SameSite != http.SameSiteStrictMode || set.Path != "/console" || set.MaxAge != 0 || !set.Expires.IsZero() {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/console, no expiry (the browser's session only)", set)
	}

	// Signing out is a state change: it needs the CSRF token.
	resp, _ = b.do("POST", "/console/signout", url.Values{}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("sign out without the CSRF token answered %d, want 403", resp.StatusCode)
	}
	resp, _ = b.do("POST", "/console/signout", url.Values{"csrf": {csrfFor(callerToken)}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out answered %d, want 303", resp.StatusCode)
	}
	if resp, _ = b.do("GET", "/console/approvals", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after signing out, the approvals answered %d, want 303 to sign in", resp.StatusCode)
	}
}

// TestCSRF: no state change without the session's CSRF token, or from another origin.
func TestCSRF(t *testing.T) {
	api, b := newConsole(t)
	csrf := b.signIn(approverToken)
	form := url.Values{"decision": {"approve"}, "args_digest": {"sha256:aa"}}
	for _, tc := range []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no token", form, nil},
		{"a wrong token", withCSRF(form, "x"+csrf), nil},
		{"another token's", withCSRF(form, csrfFor(callerToken)), nil},
		{"another origin", withCSRF(form, csrf), map[string]string{"Origin": "https://evil.example"}},
		{"another site", withCSRF(form, csrf), map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"an opaque origin", withCSRF(form, csrf), map[string]string{"Origin": "null"}},
	} {
		resp, page := b.do("POST", "/console/approvals/c_new", tc.form, tc.header)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "console") {
			t.Errorf("%s: HTTP %d, want 403 with a page saying what to do", tc.name, resp.StatusCode)
		}
	}
	if d := api.decisions(); len(d) != 0 {
		t.Fatalf("refused requests reached the API: %v", d)
	}
	resp, _ := b.do("POST", "/console/approvals/c_new", withCSRF(form, csrf), map[string]string{"Origin": b.base, "Sec-Fetch-Site": "same-origin"})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "queued") {
		t.Fatalf("approve: HTTP %d to %q, want 303 back to the approvals saying queued", resp.StatusCode, resp.Header.Get("Location"))
	}
	d := api.decisions()
	if len(d) != 1 || d[0]["decision"] != "approve" || d[0]["args_digest"] != "sha256:aa" {
		t.Fatalf("the API got %v, want one approval bound to the digest shown", d)
	}
	// The header form, for scripts.
	resp, _ = b.do("POST", "/console/approvals/c_new", url.Values{"decision": {"deny"}, "reason": {" use staging "}}, map[string]string{csrfHeader: csrf})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "denied") {
		t.Fatalf("deny: HTTP %d to %q, want 303 saying denied", resp.StatusCode, resp.Header.Get("Location"))
	}
	if d = api.decisions(); d[len(d)-1]["reason"] != "use staging" {
		t.Fatalf("the API got %v, want the deny with its reason", d[len(d)-1])
	}
	// A reason typed before pressing approve is not sent: it goes with a deny only.
	b.do("POST", "/console/approvals/c_new", withCSRF(url.Values{"decision": {"approve"}, "reason": {"fine"}}, csrf), nil)
	if d = api.decisions(); d[len(d)-1]["reason"] != nil {
		t.Fatalf("the API got %v, want an approval without a reason", d[len(d)-1])
	}
	// Approve always sends the argv prefix as words.
	b.do("POST", "/console/approvals/c_new", withCSRF(url.Values{"always": {"1"}, "argv_prefix": {" mkdir  -p "}}, csrf), nil)
	d = api.decisions()
	if last := d[len(d)-1]; last["always"] != true || last["decision"] != "approve" || len(last["argv_prefix"].([]any)) != 2 {
		t.Fatalf("approve always sent %v, want always with argv_prefix [mkdir -p]", last)
	}
	for _, a := range api.authz {
		if a != "Bearer "+approverToken && a != "Bearer "+callerToken {
			t.Fatalf("the API was called with %q", a)
		}
	}
}

func withCSRF(v url.Values, csrf string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = vs
	}
	out.Set(csrfField, csrf)
	return out
}

// TestApprovalsPage: oldest first, everything an approver needs, hostile arguments as text, and no
// buttons for a caller.
func TestApprovalsPage(t *testing.T) {
	_, b := newConsole(t)
	b.signIn(approverToken)
	for _, path := range []string{"/console/approvals", "/console/approvals/live"} {
		resp, page := b.do("GET", path, nil, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: HTTP %d", path, resp.StatusCode)
		}
		old, young := strings.Index(page, "c_old"), strings.Index(page, "c_new")
		if old < 0 || young < 0 || old > young {
			t.Errorf("%s: want c_old (older) before c_new:\n%s", path, page)
		}
		for _, want := range []string{"mutating-commands", "it changes the workspace", "sha256:aa", "acme", `value="approve"`, `value="deny"`, `name="always"`, `name="argv_prefix" value="mkdir"`,
			`<span class="sh-cmd">mkdir</span>`, `<span class="sh-op">&amp;&amp;</span>`} {
			if !strings.Contains(page, want) {
				t.Errorf("%s: the page does not show %q", path, want)
			}
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "\x1b", "\x07"} {
			if strings.Contains(page, bad) {
				t.Errorf("%s: the page carries %q of the arguments as markup or raw", path, bad)
			}
		}
		if !strings.Contains(page, `<span class="ctl">\x1b</span>[31mred<span class="ctl">\x1b</span>[0m<span class="ctl">\x07</span>`) {
			t.Errorf("%s: the escape sequences of the arguments are not shown as text", path)
		}
	}

	for q, want := range map[string]bool{"c_abcdefghijklmnopqrstuvwxyz+queued": true, "Call+evil.example+now": false, "c_x+lol": false} {
		if _, page := b.do("GET", "/console/approvals?done="+q, nil, nil); strings.Contains(page, `class="done"`) != want {
			t.Errorf("?done=%s: shown %v, want %v", q, !want, want)
		}
	}

	_, b = newConsole(t)
	b.signIn(callerToken)
	resp, page := b.do("GET", "/console/approvals", nil, nil)
	if resp.StatusCode != 200 || strings.Contains(page, `value="approve"`) || !strings.Contains(page, "may not approve") {
		t.Fatalf("a caller's approvals page (HTTP %d) shows approve buttons or does not say why not:\n%s", resp.StatusCode, page)
	}
}

// TestSecurityHeaders: every answer, pages, fragments, assets and errors, carries the strict CSP, and no
// page has an inline script, style or event handler.
func TestSecurityHeaders(t *testing.T) {
	_, b := newConsole(t)
	check := func(path string, wantCode int) string {
		t.Helper()
		resp, page := b.do("GET", path, nil, nil)
		if resp.StatusCode != wantCode {
			t.Errorf("%s: HTTP %d, want %d", path, resp.StatusCode, wantCode)
		}
		h := resp.Header
		if h.Get("Content-Security-Policy") != csp || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("Referrer-Policy") != "same-origin" {
			t.Errorf("%s: security headers missing: %v", path, h)
		}
		return page
	}
	pages := []string{check("/console/signin", 200), check("/console/nowhere", 404)}
	b.signIn(approverToken)
	pages = append(pages, check("/console/approvals", 200), check("/console/approvals/live", 200))
	check("/console/assets/console.js", 200)
	check("/console/assets/console.css", 200)
	for _, p := range []string{"script-src 'self'", "default-src 'none'", "frame-ancestors 'none'", "form-action 'self'"} {
		if !strings.Contains(csp, p) {
			t.Errorf("the CSP lacks %q", p)
		}
	}
	inline := regexp.MustCompile(`(?i)<[a-z][^>]*\s(on[a-z]+|style)=|<style|javascript:|https?://`)
	scriptTag := regexp.MustCompile(`(?i)<script[^>]*>[^<]*`)
	for _, p := range pages {
		if m := inline.FindString(p); m != "" {
			t.Errorf("a page has an inline style, handler or an outside URL %q:\n%s", m, p)
		}
		for _, tag := range scriptTag.FindAllString(p, -1) {
			if tag != `<script src="/console/assets/console.js" defer>` {
				t.Errorf("a page has a script other than the console's own file: %q", tag)
			}
		}
	}
}

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain\n\ttab":                  "plain\n\ttab",
		"\x1b[31mred\x1b[0m":            `\x1b[31mred\x1b[0m`,
		"bell\x07 nul\x00 del\x7f cr\r": `bell\x07 nul\x00 del\x7f cr\x0d`,
		"bidi\u202eevil c1\u009b":       `bidi\u202eevil c1\u009b`,
		"bad\xffutf8 \uFFFD":            "bad\uFFFDutf8 \uFFFD",
	} {
		if got := visible(in); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := string(visibleHTML("<b>\x1b[1m&")), `&lt;b&gt;<span class="ctl">\x1b</span>[1m&amp;`; got != want {
		t.Errorf("visibleHTML = %s, want %s", got, want)
	}
}

func TestHighlightShell(t *testing.T) {
	got := string(highlightShell(`FOO=1 rm -rf "$HOME/<b>" | tee x; echo '</pre>' # done` + "\x1b"))
	want := `<span class="sh-var">FOO=1</span> <span class="sh-cmd">rm</span> -rf <span class="sh-str">&#34;$HOME/&lt;b&gt;&#34;</span> ` +
		`<span class="sh-op">|</span> <span class="sh-cmd">tee</span> x<span class="sh-op">;</span> <span class="sh-cmd">echo</span> ` +
		`<span class="sh-str">&#39;&lt;/pre&gt;&#39;</span> <span class="sh-com"># done<span class="ctl">\x1b</span></span>`
	if got != want {
		t.Fatalf("highlightShell:\n got %s\nwant %s", got, want)
	}
}
