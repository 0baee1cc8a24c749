package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// sseEvent is one event of an event stream, with when it was read.
type sseEvent struct {
	id, name string
	data     []byte
	at       time.Time
}

// events sends req with Accept: text/event-stream and calls fn for each event until the stream ends or
// fn returns false. It fails the test on a non-200 answer.
func events(t testing.TB, req *http.Request, fn func(sseEvent) bool) {
	t.Helper()
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: HTTP %d %s: %s", req.Method, req.URL, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" && ev.name != "":
			ev.at = time.Now()
			if !fn(ev) {
				return
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = append(ev.data, line[6:]...)
		}
	}
}

// outputBytes decodes a stdout or stderr event: its offset and bytes.
func outputBytes(t testing.TB, ev sseEvent) (int64, []byte) {
	t.Helper()
	var o struct {
		Offset int64  `json:"offset"`
		Text   string `json:"text"`
		Base64 string `json:"base64"`
	}
	if err := json.Unmarshal(ev.data, &o); err != nil {
		t.Fatalf("decode %s event: %v: %s", ev.name, err, ev.data)
	}
	if o.Base64 != "" {
		b, err := base64.StdEncoding.DecodeString(o.Base64)
		if err != nil {
			t.Fatalf("decode base64: %v", err)
		}
		return o.Offset, b
	}
	return o.Offset, []byte(o.Text)
}

// followed is what a follower read of a call.
type followed struct {
	stdout, stderr []byte
	statuses       []call.Status
	result         *call.Result
	firstOutput    time.Time // when the first stdout event arrived
	lastID         string
}

func collect(t testing.TB, req *http.Request) *followed {
	t.Helper()
	f := &followed{}
	events(t, req, func(ev sseEvent) bool {
		f.lastID = ev.id
		switch ev.name {
		case "status":
			var st struct {
				Status call.Status `json:"status"`
			}
			_ = json.Unmarshal(ev.data, &st)
			f.statuses = append(f.statuses, st.Status)
		case "stdout", "stderr":
			off, b := outputBytes(t, ev)
			dst := &f.stdout
			if ev.name == "stderr" {
				dst = &f.stderr
			}
			if off != int64(len(*dst)) {
				t.Fatalf("%s event at offset %d, but %d bytes were received before it", ev.name, off, len(*dst))
			}
			*dst = append(*dst, b...)
			if ev.name == "stdout" && f.firstOutput.IsZero() {
				f.firstOutput = ev.at
			}
		case "result":
			f.result = &call.Result{}
			if err := json.Unmarshal(ev.data, f.result); err != nil {
				t.Fatalf("decode result event: %v", err)
			}
			return false
		}
		return true
	})
	if f.result == nil {
		t.Fatal("the event stream ended without a result event")
	}
	return f
}

func (s *stack) request(t testing.TB, method, path, token string, body any) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

// secondDispatcher starts another dispatcher replica on the stack's NATS and returns its URL.
func (s *stack) secondDispatcher(t testing.TB) string {
	t.Helper()
	args := []string{"--config", s.configPath, "--dev-tenant", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(s.dataDir, "d2"), "--nats-url", s.natsURL}
	if s.policyPath != "" {
		args = append(args, "--policy", s.policyPath)
	}
	d := start(t, "dispatcher", args...)
	return "http://" + d.WaitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)
}

// The command of TestOutputStreamsAndRanges: lines spaced in time, then a burst larger than the model's
// cap, then bytes that are not UTF-8, and a line on stderr.
const streamCommand = `for i in 1 2 3 4 5; do echo "line $i"; sleep 0.3; done; head -c 300000 /dev/zero | tr '\0' y; printf '\377\376end\n'; echo oops >&2`

func streamExpected() []byte {
	var b bytes.Buffer
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	b.Write(bytes.Repeat([]byte("y"), 300000))
	b.WriteString("\xff\xfeend\n")
	return b.Bytes()
}

// TestOutputStreamsAndRanges: a command's output streams live over SSE (POST with Accept:
// text/event-stream, and GET .../events on another dispatcher replica, resumed with Last-Event-ID),
// byte for byte including bytes that are not UTF-8; the envelope's output is cut to the default cap and
// names read_output, which reads the rest, as does the range endpoint; bad inputs get 4xx answers.
func TestOutputStreamsAndRanges(t *testing.T) {
	s := startStack(t)
	want := streamExpected()
	body := map[string]any{"tool": "run_shell", "args": map[string]any{"command": streamCommand}, "workspace": "ws"}
	start := time.Now()
	f := collect(t, s.request(t, http.MethodPost, "/v1/calls", "alpha-token", body))
	res := f.result
	if res.Status != call.StatusOK || !bytes.Equal(f.stdout, want) || string(f.stderr) != "oops\n" {
		t.Fatalf("status %s; streamed %d bytes of stdout (want %d, equal %v), stderr %q", res.Status, len(f.stdout), len(want), bytes.Equal(f.stdout, want), f.stderr)
	}
	if len(f.statuses) < 2 || f.statuses[len(f.statuses)-1] != call.StatusOK {
		t.Errorf("statuses %v, want queued or running first and ok last", f.statuses)
	}
	// The first line was printed about 1.2 s before the command ended: it must have arrived live, not
	// with the result.
	if ran := time.Duration(res.Timing.RunMS) * time.Millisecond; ran < time.Second || f.firstOutput.After(start.Add(time.Duration(res.Timing.TotalMS)*time.Millisecond-500*time.Millisecond)) {
		t.Errorf("first output arrived %s after the request, the call took %d ms: not live", f.firstOutput.Sub(start), res.Timing.TotalMS)
	}
	if len(res.Output) > 30000 || !res.Truncated || !strings.Contains(res.Output, `read_output {"call_id":"`+res.ID+`","stream":"stdout","offset":`) {
		t.Errorf("output %d bytes, truncated %v, without a read_output hint:\n%.400s", len(res.Output), res.Truncated, res.Output)
	}
	if st := res.Streams["stdout"]; st == nil || st.Bytes != int64(len(want)) || st.Kept != st.Bytes || st.Object != "" {
		t.Errorf("streams.stdout = %+v, want %d bytes kept and no object name", st, len(want))
	}

	// The range endpoint: exact bytes, binary included.
	r := s.do(t, http.MethodGet, fmt.Sprintf("/v1/calls/%s/stdout?offset=%d&limit=8", res.ID, len(want)-9), "alpha-token", nil)
	if r.code != http.StatusOK || !bytes.Equal(r.body, want[len(want)-9:len(want)-1]) {
		t.Errorf("range read: HTTP %d %q, want %q", r.code, r.body, want[len(want)-9:len(want)-1])
	}
	// read_output, as a model calls it.
	r = s.do(t, http.MethodPost, "/v1/calls", "alpha-token", map[string]any{"tool": "read_output",
		"args": map[string]any{"call_id": res.ID, "offset": 7, "limit": 7}})
	if got := r.result(t); got.Status != call.StatusOK || !strings.HasPrefix(got.Output, "line 2\n\n[bytes 7 to 14 of 300") {
		t.Errorf("read_output: %s %q", got.Status, got.Output)
	}

	// Another replica, resumed after the first 100 bytes of stdout and all of stderr's.
	url2 := s.secondDispatcher(t)
	req := s.request(t, http.MethodGet, "/v1/calls/"+res.ID+"/events", "alpha-token", nil)
	req.URL, _ = req.URL.Parse(url2 + "/v1/calls/" + res.ID + "/events")
	req.Header.Set("Last-Event-ID", "100.5")
	resumed, ended := int64(100), false
	events(t, req, func(ev sseEvent) bool {
		if ev.name == "stdout" {
			off, b := outputBytes(t, ev)
			if off != resumed || !bytes.Equal(b, want[off:off+int64(len(b))]) {
				t.Fatalf("resumed stdout event at %d (after %d bytes) is not the stream's bytes there", off, resumed)
			}
			resumed += int64(len(b))
		}
		if ev.name == "result" && resumed != int64(len(want)) {
			t.Fatalf("the resumed stream ended at byte %d of stdout, want %d", resumed, len(want))
		}
		if ev.name == "stderr" {
			t.Fatalf("resumed after all of stderr, got stderr again: %s", ev.data)
		}
		ended = ev.name == "result"
		return !ended
	})
	if !ended {
		t.Fatalf("the resumed stream closed at byte %d of stdout without a result event", resumed)
	}

	bad := []struct {
		name, method, path, token, lastID string
		body                              any
		code                              int
		says                              string
	}{
		{"bad Last-Event-ID", http.MethodGet, "/v1/calls/" + res.ID + "/events", "alpha-token", "x", nil, http.StatusBadRequest, "Last-Event-ID"},
		{"negative offset", http.MethodGet, "/v1/calls/" + res.ID + "/stdout?offset=-1", "alpha-token", "", nil, http.StatusBadRequest, "offset"},
		{"zero limit", http.MethodGet, "/v1/calls/" + res.ID + "/stdout?limit=0", "alpha-token", "", nil, http.StatusBadRequest, "limit"},
		{"offset past the end", http.MethodGet, fmt.Sprintf("/v1/calls/%s/stdout?offset=%d", res.ID, len(want)+1), "alpha-token", "", nil, http.StatusRequestedRangeNotSatisfiable, "past the end"},
		{"no such stream", http.MethodGet, "/v1/calls/" + res.ID + "/stdin", "alpha-token", "", nil, http.StatusNotFound, "stdout or stderr"},
		{"another tenant's call", http.MethodGet, "/v1/calls/" + res.ID + "/stdout", "beta-token", "", nil, http.StatusNotFound, "no call"},
		{"another tenant's events", http.MethodGet, "/v1/calls/" + res.ID + "/events", "beta-token", "", nil, http.StatusNotFound, "no call"},
		{"read_output without call_id", http.MethodPost, "/v1/calls", "alpha-token", "", map[string]any{"tool": "read_output", "args": map[string]any{}}, http.StatusUnprocessableEntity, "call_id"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			req := s.request(t, b.method, b.path, b.token, b.body)
			if b.lastID != "" {
				req.Header.Set("Last-Event-ID", b.lastID)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != b.code || !strings.Contains(string(data), b.says) {
				t.Errorf("HTTP %d %s, want %d saying %q", resp.StatusCode, data, b.code, b.says)
			}
		})
	}
	// read_output of a call that is another tenant's: the model learns it does not exist.
	r = s.do(t, http.MethodPost, "/v1/calls", "beta-token", map[string]any{"tool": "read_output", "args": map[string]any{"call_id": res.ID}})
	if got := r.result(t); got.Status != call.StatusError || got.Error == nil || got.Error.Type != call.ErrNotFound {
		t.Errorf("read_output of another tenant's call: %s %+v", got.Status, got.Error)
	}
}
