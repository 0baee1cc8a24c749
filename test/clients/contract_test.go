package clients

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// contract checks real answers against the OpenAPI 3.1 document the dispatcher serves: the operation a
// request reaches (by method and path template), the answer's status among that operation's responses,
// its Content-Type among the response's media types, and a JSON body (or each Server-Sent Event's data,
// by the media type's x-toolpool-events) against the response's schema, with JSON Schema 2020-12 (OpenAPI
// 3.1's dialect) and its formats asserted. It counts the operations it saw answer, so that a test can
// require every operation of the document to have been checked.
type contract struct {
	doc      map[string]any
	compiler *jsonschema.Compiler

	mu       sync.Mutex
	compiled map[string]*jsonschema.Schema
	seen     map[string]map[int]bool // operation ("GET /v1/calls/{id}") to the statuses checked
}

const docURL = "toolpool-openapi.json"

func newContract(t testing.TB, raw []byte) *contract {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the OpenAPI document is not JSON: %v", err)
	}
	m, ok := doc.(map[string]any)
	if !ok || m["openapi"] != "3.1.0" {
		t.Fatalf("the OpenAPI document says openapi %v; want 3.1.0", m["openapi"])
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, doc); err != nil {
		t.Fatal(err)
	}
	return &contract{doc: m, compiler: c, compiled: map[string]*jsonschema.Schema{}, seen: map[string]map[int]bool{}}
}

// operations lists every operation of the document ("GET /v1/calls/{id}").
func (c *contract) operations() []string {
	var ops []string
	for path, item := range c.doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			if method != "parameters" {
				ops = append(ops, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(ops)
	return ops
}

// template finds the path template of the document that path matches; literal segments win over
// parameters, and a trailing {path} parameter takes the rest of the path.
func (c *contract) template(path string) (string, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	best, bestScore := "", -1
	for tmpl := range c.doc["paths"].(map[string]any) {
		ts := strings.Split(strings.Trim(tmpl, "/"), "/")
		score, ok := 0, true
		for i, t := range ts {
			last := i == len(ts)-1
			switch {
			case i >= len(segs):
				ok = false
			case t == "{path}" && last:
				// the rest of the path
			case strings.HasPrefix(t, "{"):
				ok = ok && segs[i] != ""
			case t == segs[i]:
				score++
			default:
				ok = false
			}
		}
		if len(segs) > len(ts) && ts[len(ts)-1] != "{path}" {
			ok = false
		}
		if ok && score > bestScore {
			best, bestScore = tmpl, score
		}
	}
	return best, bestScore >= 0
}

// pointer escapes a JSON pointer token.
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// resolve follows a local $ref ("#/components/responses/Error") to its target and pointer.
func (c *contract) resolve(v any, ptr string) (map[string]any, string) {
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		ptr = strings.TrimPrefix(ref, "#")
		var cur any = c.doc
		for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
			tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
			cur = cur.(map[string]any)[tok]
		}
		m, _ = cur.(map[string]any)
	}
	return m, ptr
}

func (c *contract) schema(ptr string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.compiled[ptr]; ok {
		return s, nil
	}
	s, err := c.compiler.Compile(docURL + "#" + ptr)
	if err != nil {
		return nil, fmt.Errorf("compile the document's schema at %s: %w", ptr, err)
	}
	c.compiled[ptr] = s
	return s, nil
}

// check returns what in the answer to method path (status, header, body) the document does not allow,
// and counts the operation as seen.
func (c *contract) check(method, path string, status int, header http.Header, body []byte) error {
	tmpl, ok := c.template(path)
	if !ok {
		return fmt.Errorf("%s %s: no path of the document matches", method, path)
	}
	op, ok := c.doc["paths"].(map[string]any)[tmpl].(map[string]any)[strings.ToLower(method)].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s: the document has no %s operation on %s", method, path, method, tmpl)
	}
	name := method + " " + tmpl
	c.mu.Lock()
	if c.seen[name] == nil {
		c.seen[name] = map[int]bool{}
	}
	c.seen[name][status] = true
	c.mu.Unlock()
	code := strconv.Itoa(status)
	resp, ptr := c.resolve(op["responses"].(map[string]any)[code], pointer("paths", tmpl, strings.ToLower(method), "responses", code))
	if resp == nil {
		return fmt.Errorf("%s: HTTP %d is not among the document's responses: %s", name, status, trim(body))
	}
	content, _ := resp["content"].(map[string]any)
	if len(content) == 0 {
		if len(body) > 0 {
			return fmt.Errorf("%s: HTTP %d has a body, but the document's response has no content", name, status)
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(header.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("%s: HTTP %d: Content-Type %q: %v", name, status, header.Get("Content-Type"), err)
	}
	if _, ok := content[mt]; !ok {
		return fmt.Errorf("%s: HTTP %d: Content-Type %s is not among the response's media types %v", name, status, mt, keys(content))
	}
	switch {
	case mt == "application/json":
		return c.validate(name, status, ptr+pointer("content", mt, "schema"), body)
	case mt == "text/event-stream":
		media, _ := c.resolve(content[mt], "")
		return c.checkEvents(name, media, body)
	}
	return nil
}

func (c *contract) validate(name string, status int, ptr string, body []byte) error {
	s, err := c.schema(ptr)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: HTTP %d: the body is not JSON: %v: %s", name, status, err, trim(body))
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("%s: HTTP %d: the body does not match the document (%s): %v\nbody: %s", name, status, ptr, err, trim(body))
	}
	return nil
}

// checkEvents validates each Server-Sent Event's data against the schema the media type's
// x-toolpool-events names for its event, and requires the stream to end with a result.
func (c *contract) checkEvents(name string, media map[string]any, body []byte) error {
	events, _ := media["x-toolpool-events"].(map[string]any)
	if len(events) == 0 {
		return fmt.Errorf("%s: the event-stream response names no x-toolpool-events", name)
	}
	evs, err := parseEvents(body)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for i, ev := range evs {
		ref, ok := events[ev.event].(string)
		if !ok {
			return fmt.Errorf("%s: event %d is %q, which x-toolpool-events does not list (%v)", name, i, ev.event, keys(events))
		}
		if err := c.validate(name+" event "+ev.event, 200, strings.TrimPrefix(ref, "#"), []byte(ev.data)); err != nil {
			return err
		}
	}
	if len(evs) == 0 || evs[len(evs)-1].event != "result" {
		return fmt.Errorf("%s: the stream did not end with a result event (%d events)", name, len(evs))
	}
	return nil
}

// event is one Server-Sent Event.
type event struct{ id, event, data string }

func parseEvents(body []byte) ([]event, error) {
	var evs []event
	var cur event
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.event != "" || cur.data != "" {
				evs = append(evs, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data += strings.TrimPrefix(line, "data: ")
		default:
			return nil, fmt.Errorf("the event stream has a line that is no field: %q", line)
		}
	}
	return evs, sc.Err()
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func trim(b []byte) string {
	if len(b) > 2000 {
		return string(b[:2000]) + "..."
	}
	return string(b)
}

// client sends requests to a stack and checks every answer against the contract.
type client struct {
	t        testing.TB
	url      string
	contract *contract
}

// answer is a checked answer.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

// json decodes the answer's body.
func (a answer) json(t testing.TB) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("HTTP %d, not a JSON object: %v: %s", a.code, err, trim(a.body))
	}
	return v
}

// send sends a request (body: nil, a string or []byte as is, anything else as JSON; header: name and
// value pairs, "Content-Length" "-1" to send the body chunked) and checks the answer against the contract.
func (c *client) send(method, path, token string, body any, header ...string) answer {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Content-Length" && header[i+1] == "-1" {
			req.ContentLength = -1
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	if err := c.contract.check(method, req.URL.Path, resp.StatusCode, resp.Header, data); err != nil {
		c.t.Error(err)
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: data}
}
