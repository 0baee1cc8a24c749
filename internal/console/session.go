package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// The session is the token itself, in a cookie the browser keeps for its session only (no expiry), that
// scripts cannot read (HttpOnly), sent only to the console (Path) and only from the console's own pages
// (SameSite=Strict); Secure when the request came over TLS. The dispatcher keeps no session: every
// request is authenticated by the API with the cookie's token, so a token removed from the
// configuration signs its sessions out at their next request.
const (
	sessionCookie = "toolpool_console"
	// signinCookie carries the sign-in form's CSRF value (double submit): a page of another site cannot
	// sign a browser in with the attacker's token.
	signinCookie = "toolpool_console_signin"
	// csrfField is the form field, and csrfHeader the header for scripts, that carry the CSRF token.
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

// session is a signed-in browser: its token and the CSRF token of its forms.
type session struct {
	token string
	csrf  string
}

// csrfFor is the CSRF token of a session with token: an HMAC of a fixed label under the token, so it is
// the same on every replica, and no one without the token can compute it.
func csrfFor(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("toolpool console csrf v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// current returns the request's session, if its cookie carries a token.
func (c *Console) current(r *http.Request) (*session, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || ck.Value == "" {
		return nil, false
	}
	tok, err := url.QueryUnescape(ck.Value)
	if err != nil || tok == "" {
		return nil, false
	}
	return &session{token: tok, csrf: csrfFor(tok)}, true
}

// session lets signed-in requests through to next; a state change (any method but GET and HEAD) must
// also come from a console page: the same origin, and the session's CSRF token in the form or header.
func (c *Console) session(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.current(r)
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "you are not signed in (or your session ended): sign in again at "+Prefix+"/signin")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if msg := crossSite(r); msg != "" {
				c.fail(w, r, s, http.StatusForbidden, msg)
				return
			}
			got := r.Header.Get(csrfHeader)
			if got == "" {
				got = r.PostFormValue(csrfField)
			}
			if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
				c.fail(w, r, s, http.StatusForbidden, "this request carries no valid CSRF token: reload the console page and try again")
				return
			}
		}
		next(w, r, s)
	}
}

// crossSite says why a state-changing request did not come from this origin, or "" when it did (or the
// browser sent neither Origin nor Sec-Fetch-Site, as non-browser clients do; the CSRF token still holds).
func crossSite(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "this request came from another site (Sec-Fetch-Site: " + site + "): use the console's own pages"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return "this request came from another origin (" + o + "): use the console's own pages"
		}
	}
	return ""
}

// secureRequest reports whether the browser reached the dispatcher over TLS (directly, or through a
// proxy that says so), so that cookies are marked Secure.
func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func setCookie(w http.ResponseWriter, r *http.Request, name, value, path string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: url.QueryEscape(value), Path: path, MaxAge: maxAge,
		HttpOnly: true, Secure: secureRequest(r), SameSite: http.SameSiteStrictMode})
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	v := base64.RawURLEncoding.EncodeToString(b)
	setCookie(w, r, signinCookie, v, Prefix+"/signin", 0)
	c.render(w, r, nil, http.StatusOK, "signin", map[string]any{"SigninCSRF": v, "Error": signinMessages[r.URL.Query().Get("error")]})
}

// signin checks the token with the API and starts the session; the token travels only in the form's
// body and the cookie, never in a URL.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(signinCookie)
	if msg := crossSite(r); msg != "" || err != nil ||
		subtle.ConstantTimeCompare([]byte(url.QueryEscape(r.PostFormValue(csrfField))), []byte(ck.Value)) != 1 {
		c.fail(w, r, nil, http.StatusForbidden, "this sign-in did not come from the console's sign-in page: open "+Prefix+"/signin and sign in there")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		c.signinAgain(w, r, "empty")
		return
	}
	code, _, err := c.do(r, &session{token: token}, http.MethodGet, "/v1/approvals", nil)
	switch {
	case err != nil:
		c.fail(w, r, nil, http.StatusBadGateway, "could not check the token: "+err.Error())
		return
	case code == http.StatusUnauthorized:
		c.signinAgain(w, r, "unknown")
		return
	}
	setCookie(w, r, signinCookie, "", Prefix+"/signin", -1)
	setCookie(w, r, sessionCookie, token, Prefix, 0)
	http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
}

// signinMessages are the sign-in form's messages, by the code its URL carries: only these are ever
// shown, so a link cannot put words of its own on the console's page.
var signinMessages = map[string]string{
	"empty":   "enter your tenant token",
	"unknown": "this token is not known to the dispatcher: check it, or the dispatcher's api.tenants",
	"expired": "your token is no longer accepted: sign in again",
}

// signinAgain shows the sign-in form with the message of code (signinMessages), with a fresh CSRF value.
func (c *Console) signinAgain(w http.ResponseWriter, r *http.Request, code string) {
	http.Redirect(w, r, Prefix+"/signin?error="+url.QueryEscape(code), http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, _ *session) {
	setCookie(w, r, sessionCookie, "", Prefix, -1)
	http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
}
