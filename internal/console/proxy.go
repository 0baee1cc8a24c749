package console

import (
	"bytes"
	"net/http"
)

// proxy streams the API's answer to req straight to the browser (an event stream, a download), unless
// the API refuses: a refusal (any status but 2xx) is shown as the console's error page instead of the
// API's JSON.
func (c *Console) proxy(w http.ResponseWriter, r *http.Request, s *session, req *http.Request) {
	pw := &passthrough{ResponseWriter: w}
	c.api.ServeHTTP(pw, req)
	if pw.refused {
		for _, h := range []string{"Content-Disposition", "Content-Length", "Location", "Retry-After", "Content-Range"} {
			w.Header().Del(h)
		}
		c.failAPI(w, r, s, newAPIError(pw.code, pw.body.Bytes()))
	}
}

// passthrough writes a 2xx answer through to the browser as it comes, and holds any other (bounded by
// maxAnswer) for the error page. Unwrap lets http.ResponseController flush and set deadlines through it.
type passthrough struct {
	http.ResponseWriter
	code    int
	refused bool
	body    bytes.Buffer
}

func (p *passthrough) WriteHeader(code int) {
	if p.code != 0 {
		return
	}
	p.code = code
	if code/100 != 2 {
		p.refused = true
		return
	}
	p.ResponseWriter.WriteHeader(code)
}

func (p *passthrough) Write(b []byte) (int, error) {
	if p.code == 0 {
		p.WriteHeader(http.StatusOK)
	}
	if p.refused {
		if p.body.Len()+len(b) <= maxAnswer {
			p.body.Write(b)
		}
		return len(b), nil
	}
	return p.ResponseWriter.Write(b)
}

func (p *passthrough) Flush() {
	if !p.refused {
		_ = http.NewResponseController(p.ResponseWriter).Flush()
	}
}

func (p *passthrough) Unwrap() http.ResponseWriter { return p.ResponseWriter }
