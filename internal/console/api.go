package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/toolpool/toolpool/internal/call"
)

// maxAnswer bounds an API answer the console reads whole to render a page (an envelope carries at most a
// few MiB of output); larger answers are refused rather than held.
const maxAnswer = 32 << 20

// apiRequest is a request to the API as the session's token: the browser's request's context and remote
// address, none of its headers (no cookie reaches the API).
func apiRequest(r *http.Request, s *session, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(r.Context(), method, path, body)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, path, err)
	}
	req.RemoteAddr = r.RemoteAddr
	req.Host = r.Host
	req.Header.Set("Authorization", "Bearer "+s.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// do sends a request to the API in process and returns its status and body. body, when not nil, is sent
// as JSON.
func (c *Console) do(r *http.Request, s *session, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, fmt.Errorf("encode request %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := apiRequest(r, s, method, path, rd)
	if err != nil {
		return 0, nil, err
	}
	rec := &answer{header: http.Header{}}
	c.api.ServeHTTP(rec, req)
	if rec.over {
		return 0, nil, fmt.Errorf("read %s %s: the answer is over %d bytes", method, path, maxAnswer)
	}
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return rec.code, rec.body.Bytes(), nil
}

// get sends a GET to the API and decodes a 2xx answer into v; any other answer is an *apiError.
func (c *Console) get(r *http.Request, s *session, path string, v any) error {
	return c.json(r, s, http.MethodGet, path, nil, v)
}

// json sends a request and decodes a 2xx answer into v (when not nil); any other answer is an *apiError.
func (c *Console) json(r *http.Request, s *session, method, path string, body, v any) error {
	code, b, err := c.do(r, s, method, path, body)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return newAPIError(code, b)
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// envelope sends a request that the API answers with a call's envelope, and returns it with the
// answer's bytes. A call that policy or a person denied comes with a denial's status and its envelope;
// any other answer but a 2xx envelope is an *apiError.
func (c *Console) envelope(r *http.Request, s *session, method, path string, body any) (*call.Result, []byte, error) {
	code, b, err := c.do(r, s, method, path, body)
	if err != nil {
		return nil, nil, err
	}
	var res call.Result
	if json.Unmarshal(b, &res) != nil || res.ID == "" || (code/100 != 2 && res.Status != call.StatusDenied) {
		return nil, nil, newAPIError(code, b)
	}
	return &res, b, nil
}

// apiError is the API's refusal: its status and its error body's message, shown to the person as is.
type apiError struct {
	Code    int
	Type    string
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d %s: %s", e.Code, e.Type, e.Message) }

func newAPIError(code int, body []byte) *apiError {
	var eb struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	e := &apiError{Code: code}
	if json.Unmarshal(body, &eb) == nil && eb.Error.Message != "" {
		e.Type, e.Message = eb.Error.Type, eb.Error.Message
	} else {
		e.Message = string(body)
	}
	return e
}

// isAPIError reports whether err is the API's refusal with code.
func isAPIError(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

// answer is an in-memory http.ResponseWriter for one API answer, bounded by maxAnswer.
type answer struct {
	header http.Header
	code   int
	body   bytes.Buffer
	over   bool
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(code int) {
	if a.code == 0 {
		a.code = code
	}
}

func (a *answer) Write(p []byte) (int, error) {
	if a.code == 0 {
		a.code = http.StatusOK
	}
	if a.body.Len()+len(p) > maxAnswer {
		a.over = true
		return 0, errors.New("console: answer too large")
	}
	return a.body.Write(p)
}
