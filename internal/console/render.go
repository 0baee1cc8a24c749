package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// pageNames are the pages, each templates/NAME.html parsed with templates/layout.html.
var pageNames = []string{"signin", "error", "approvals", "calls", "call", "output", "workspaces", "workspace", "file", "pool"}

var funcs = template.FuncMap{
	"visible": visibleHTML,
	"shell":   highlightShell,
	"when":    when,
	"bytes":   humanBytes,
	"seconds": seconds,
	"int":     func(v float64) int64 { return int64(v) },
}

func (c *Console) parse() error {
	c.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("parse console page %s: %w", name, err)
		}
		c.pages[name] = t
	}
	return nil
}

// view is what every page's template gets: the page's data and the session's CSRF token.
type view struct {
	Page     string
	SignedIn bool
	CSRF     string
	Data     any
}

// render writes page name (or, when block is not "", only that block of it) with data.
func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, code int, name string, data any) {
	c.renderBlock(w, r, s, code, name, "layout", data)
}

func (c *Console) renderBlock(w http.ResponseWriter, _ *http.Request, s *session, code int, name, block string, data any) {
	v := view{Page: name, Data: data}
	if s != nil {
		v.SignedIn, v.CSRF = true, s.csrf
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, block, v); err != nil {
		c.log.Error("render console page", "page", name, "error", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page with msg under code.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, code int, msg string) {
	c.render(w, r, s, code, "error", map[string]any{"Code": code, "Status": http.StatusText(code), "Message": msg})
}

// failAPI shows the API's refusal err (its status and message), sends a browser whose token the API no
// longer knows to sign in, and shows any other error as the console's failure.
func (c *Console) failAPI(w http.ResponseWriter, r *http.Request, s *session, err error) {
	var ae *apiError
	switch {
	case isAPIError(err, http.StatusUnauthorized):
		setCookie(w, r, sessionCookie, "", Prefix, -1)
		c.signinAgain(w, r, "expired")
	case errors.As(err, &ae):
		c.fail(w, r, s, ae.Code, ae.Message)
	default:
		c.log.Error("console request to the API", "path", r.URL.Path, "error", err)
		c.fail(w, r, s, http.StatusBadGateway, "the console could not read this from the API: "+err.Error())
	}
}

// visible returns s as text a page can show without anything in it taking effect: every control
// character but newline and tab as an escape in Go's notation (ESC as \x1b, so an escape sequence reads
// "\x1b[31m" instead of colouring anything; BEL as \x07), C1 controls, line separators and
// bidirectional overrides (which could disguise what is shown) as \uXXXX, and bytes that are not UTF-8
// as U+FFFD. The notation needs no special font. The result is text, escaped again by the template.
func visible(s string) string {
	var b strings.Builder
	for _, part := range controls(s) {
		b.WriteString(part.text)
	}
	return b.String()
}

// visibleHTML is visible(s) as HTML, each control character's escape in a span of class "ctl", so that
// it stands out from printed text that happens to read the same.
func visibleHTML(s string) template.HTML {
	var b strings.Builder
	for _, part := range controls(s) {
		if part.control {
			b.WriteString(`<span class="ctl">` + part.text + `</span>`)
		} else {
			b.WriteString(template.HTMLEscapeString(part.text))
		}
	}
	return template.HTML(b.String())
}

// piece is a run of printable text, or one control character's escape.
type piece struct {
	text    string
	control bool
}

// controls splits s into printable runs and control characters' escapes (visible).
func controls(s string) []piece {
	var out []piece
	var run strings.Builder
	flush := func() {
		if run.Len() > 0 {
			out = append(out, piece{text: run.String()})
			run.Reset()
		}
	}
	for i, r := range s {
		var esc string
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			run.WriteRune('\uFFFD')
		case r == '\n' || r == '\t':
			run.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			esc = fmt.Sprintf("\\x%02x", r)
		case r >= 0x80 && r < 0xa0, r == '\u2028', r == '\u2029', r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
			esc = fmt.Sprintf("\\u%04x", r)
		default:
			run.WriteRune(r)
		}
		if esc != "" {
			flush()
			out = append(out, piece{text: esc, control: true})
		}
	}
	flush()
	return out
}

// when formats a time for a page: UTC, to the second; "" for the zero time.
func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// pretty is v as indented JSON, for showing arguments and envelopes in full.
func pretty(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}
