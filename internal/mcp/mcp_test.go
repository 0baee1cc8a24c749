package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
)

// These tests drive the handler with the Go SDK's own client, at both protocol versions, over a fake call
// path (fakeCalls): the real dispatcher, NATS and containerd are test/mcp's.

type principalKey struct{}

const principal = "acme/alice"

// fakeCalls is an in-memory call path: Submit decides by tool name, and a worker goroutine runs queued
// calls ("echo" ends ok, "fail" ends in error, "sleep" runs until cancelled).
type fakeCalls struct {
	t        *testing.T
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at every change
	calls    map[string]*call.Result
	args     map[string]json.RawMessage
	approver bool
	release  chan struct{} // closed: "gated" calls, which run until then, end ok
	hidden   string        // a tool Tools leaves out, as a policy change would
	// onSubmit, if set, runs for each call accepted, before it is queued (a command that prints early).
	onSubmit func(id string)

	submitted []call.Request
	traceIDs  []string
	cancelled []string
	decided   []string // "approve c_..." or "deny c_..."
}

func newFake(t *testing.T) *fakeCalls {
	f := &fakeCalls{t: t, changed: make(chan struct{}), calls: map[string]*call.Result{}, args: map[string]json.RawMessage{}, approver: true, release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.work(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *fakeCalls) checkCaller(ctx context.Context) {
	if ctx.Value(principalKey{}) != principal {
		f.t.Errorf("the call path was called without the request's caller in its context")
	}
}

// update changes a call under the lock and wakes every waiter.
func (f *fakeCalls) update(id string, change func(r *call.Result)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.calls[id])
	close(f.changed)
	f.changed = make(chan struct{})
}

// work is the fake worker: it starts queued calls and ends them as their tool says.
func (f *fakeCalls) work(ctx context.Context) {
	for {
		f.mu.Lock()
		var next []*call.Result
		for _, r := range f.calls {
			if r.Status == call.StatusQueued || r.Status == call.StatusRunning && (r.Tool != "gated" || r.CancelRequested) {
				c := *r
				next = append(next, &c)
			}
		}
		ch := f.changed
		f.mu.Unlock()
		for _, r := range next {
			switch {
			case r.Status == call.StatusQueued:
				f.update(r.ID, func(r *call.Result) { r.Status, r.Worker = call.StatusRunning, "w1" })
				if r.Tool == "gated" {
					go func() {
						select {
						case <-f.release:
							f.update(r.ID, func(r *call.Result) { r.Status, r.ExitCode, r.Output = call.StatusOK, new(0), "released" })
						case <-ctx.Done():
						}
					}()
				}
			case r.CancelRequested:
				f.update(r.ID, func(r *call.Result) { r.Fail(call.StatusCancelled, call.ErrCancelled, "killed") })
			case r.Tool == "fail":
				f.update(r.ID, func(r *call.Result) {
					r.ExitCode = new(2)
					r.Fail(call.StatusError, call.ErrExitCode, "boom: exit code 2")
				})
			case r.Tool != "sleep":
				f.update(r.ID, func(r *call.Result) {
					r.Status, r.ExitCode, r.Output = call.StatusOK, new(0), "hello from "+r.Workspace
				})
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

func (f *fakeCalls) Tools(ctx context.Context) ([]tools.MCPTool, error) {
	f.checkCaller(ctx)
	var out []tools.MCPTool
	f.mu.Lock()
	hidden := f.hidden
	f.mu.Unlock()
	for _, name := range []string{"echo", "fail", "sleep", "gated", "guarded", "forbidden", "bad", "broken"} {
		if name == hidden {
			continue
		}
		out = append(out, tools.MCPTool{Name: name, Description: name + " things",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
			Annotations: tools.MCPAnnotations{ReadOnlyHint: name == "echo", DestructiveHint: name != "echo", OpenWorldHint: name == "sleep"}})
	}
	return out, nil
}

func (f *fakeCalls) Submit(ctx context.Context, r call.Request) (*call.Result, error) {
	f.checkCaller(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submitted = append(f.submitted, r)
	f.traceIDs = append(f.traceIDs, tracing.TraceID(ctx))
	switch r.Tool {
	case "bad":
		return nil, &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams, Message: `"text" must be a string`}
	case "broken":
		return nil, &call.Rejection{Kind: call.KindUnavailable, Type: call.ErrInternal, Message: "toolpool could not record the call; retry"}
	}
	id := r.ID
	if id == "" {
		id = call.NewID()
	}
	if old, ok := f.calls[id]; ok {
		c := *old
		return &c, nil
	}
	if f.onSubmit != nil {
		f.onSubmit(id)
	}
	res := &call.Result{ID: id, Tool: r.Tool, Workspace: cmpOr(r.Workspace, "default"), Status: call.StatusQueued,
		ArgsDigest: call.ArgsDigest(r.Args), Decision: &call.Decision{Action: "allow", Rule: "default"}}
	switch r.Tool {
	case "guarded":
		res.Status, res.Decision = call.StatusPendingApproval, &call.Decision{Action: "ask", Rule: "mutating-commands", Reason: "needs approval by rule mutating-commands"}
	case "forbidden":
		res.Decision = &call.Decision{Action: "deny", Rule: "forbidden-commands", Reason: "denied by rule forbidden-commands: sudo is never allowed"}
		res.Fail(call.StatusDenied, call.ErrPolicyDenied, res.Decision.Reason)
	}
	f.calls[id], f.args[id] = res, r.Args
	close(f.changed)
	f.changed = make(chan struct{})
	c := *res
	return &c, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (f *fakeCalls) Wait(ctx context.Context, id string, until func(*call.Result) bool) (*call.Result, error) {
	f.checkCaller(ctx)
	for {
		f.mu.Lock()
		r, ok := f.calls[id]
		var c call.Result
		if ok {
			c = *r
		}
		ch := f.changed
		f.mu.Unlock()
		if !ok {
			return nil, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: "no call " + id}
		}
		if c.Status.Terminal() || until(&c) {
			return &c, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return &c, ctx.Err()
		}
	}
}

func (f *fakeCalls) Cancel(ctx context.Context, id string) (*call.Result, error) {
	f.checkCaller(ctx)
	f.mu.Lock()
	_, ok := f.calls[id]
	f.cancelled = append(f.cancelled, id)
	f.mu.Unlock()
	if !ok {
		return nil, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: "no call " + id}
	}
	var res call.Result
	f.update(id, func(r *call.Result) {
		if r.Status == call.StatusRunning {
			r.CancelRequested = true
		} else if !r.Status.Terminal() {
			r.Fail(call.StatusCancelled, call.ErrCancelled, "cancelled before it ran")
		}
		res = *r
	})
	return &res, nil
}

// Follow is the fake Output: a running call prints one line as soon as someone follows it.
func (f *fakeCalls) Follow(ctx context.Context, id string, emit func(chunk string)) error {
	f.checkCaller(ctx)
	emit("line one of " + id + "\n")
	<-ctx.Done()
	return nil
}

func (f *fakeCalls) MayApprove(ctx context.Context) bool {
	f.checkCaller(ctx)
	return f.approver
}

func (f *fakeCalls) Decide(ctx context.Context, id, digest string, approve bool) (*call.Result, error) {
	f.checkCaller(ctx)
	f.mu.Lock()
	r, ok := f.calls[id]
	verb := map[bool]string{true: "approve", false: "deny"}[approve]
	f.decided = append(f.decided, verb+" "+id)
	f.mu.Unlock()
	switch {
	case !ok || r.Status != call.StatusPendingApproval:
		return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrNotPending, Message: "no call " + id + " waits for approval"}
	case digest != r.ArgsDigest:
		return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrDigestMismatch, Message: "another digest"}
	}
	f.update(id, func(r *call.Result) {
		if approve {
			r.Status = call.StatusQueued
		} else {
			r.Fail(call.StatusDenied, call.ErrPolicyDenied, "a person denied this call")
		}
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	c := *f.calls[id]
	return &c, nil
}

func (f *fakeCalls) snapshot() (submitted []call.Request, cancelled, decided, traces []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.submitted), slices.Clone(f.cancelled), slices.Clone(f.decided), slices.Clone(f.traceIDs)
}

// server serves the handler as the dispatcher would (the caller in the context), with legacy forcing
// clients to 2025-11-25 by refusing server/discover.
func server(t *testing.T, f *fakeCalls, cfg Config, legacy bool) *httptest.Server {
	t.Helper()
	h, err := New(cfg, f, f, slog.New(slog.NewTextHandler(io.Discard, nil)), WithOutput(f))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if legacy && r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"server/discover"`)) {
				writeRPCError(w, http.StatusBadRequest, -32601, "no server/discover here")
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.AllowedOrigins = []string{"https://app.example.com"}
	return cfg
}

// clientOpts is a client that can elicit, answering with answer, and that records progress messages.
type recorder struct {
	mu       sync.Mutex
	progress []string
	prompts  []string
	got      chan struct{} // closed and replaced at each progress notification
}

// waitProgress returns the progress messages once one of them contains want.
func (rec *recorder) waitProgress(t *testing.T, want string) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		rec.mu.Lock()
		msgs, ch := slices.Clone(rec.progress), rec.got
		rec.mu.Unlock()
		if slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, want) }) {
			return msgs
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no progress message with %q within 30s; got %q", want, msgs)
		}
	}
}

func (rec *recorder) options(answer string) *sdk.ClientOptions {
	rec.got = make(chan struct{})
	return &sdk.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
			rec.mu.Lock()
			rec.prompts = append(rec.prompts, req.Params.Message)
			rec.mu.Unlock()
			return &sdk.ElicitResult{Action: answer}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			rec.mu.Lock()
			rec.progress = append(rec.progress, req.Params.Message)
			close(rec.got)
			rec.got = make(chan struct{})
			rec.mu.Unlock()
		},
	}
}

// connect connects the Go SDK's client; header, when given, is a name and a value it sends with every
// request.
func connect(t *testing.T, url string, opts *sdk.ClientOptions, header ...string) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	transport := &sdk.StreamableClientTransport{Endpoint: url, MaxRetries: -1}
	if len(header) == 2 {
		transport.HTTPClient = &http.Client{Transport: headerTransport{header[0], header[1]}}
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type headerTransport struct{ name, value string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return http.DefaultTransport.RoundTrip(r)
}

// version is a protocol version; legacy clients are made to fall back to it (server refuses discovery).
type version struct {
	name   string
	legacy bool
}

var versions = []version{{"2026-07-28", false}, {"2025-11-25", true}}

// eachVersion runs test at both protocol versions, each with a fresh fake call path and server.
func eachVersion(t *testing.T, test func(t *testing.T, v version, f *fakeCalls, srv *httptest.Server)) {
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			f := newFake(t)
			test(t, v, f, server(t, f, testConfig(), v.legacy))
		})
	}
}

func callTool(t *testing.T, cs *sdk.ClientSession, name string, meta sdk.Meta) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: map[string]any{"text": "hi"}, Meta: meta})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func text(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func structured(t *testing.T, res *sdk.CallToolResult) summary {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var s summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return s
}

func TestListTools(t *testing.T) {
	eachVersion(t, func(t *testing.T, v version, f *fakeCalls, srv *httptest.Server) {
		cs := connect(t, srv.URL, nil)
		if got := cs.InitializeResult().ProtocolVersion; got != v.name {
			t.Fatalf("negotiated %s, want %s", got, v.name)
		}
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		if want := []string{"bad", "broken", "echo", "fail", "forbidden", "gated", "guarded", "sleep", getResultName}; !slices.Equal(sortedCopy(names), want) {
			t.Errorf("tools %v, want %v", names, want)
		}
		if res.CacheScope != "private" {
			t.Errorf("cacheScope %q: a tenant's tool list is private", res.CacheScope)
		}
		for _, tl := range res.Tools {
			a := tl.Annotations
			if a == nil || a.DestructiveHint == nil || a.OpenWorldHint == nil || tl.OutputSchema == nil {
				t.Fatalf("%s: annotations %+v, output schema %v", tl.Name, a, tl.OutputSchema)
			}
			if tl.Name == "echo" && (!a.ReadOnlyHint || *a.DestructiveHint) || tl.Name == "sleep" && !*a.OpenWorldHint ||
				tl.Name == getResultName && (!a.ReadOnlyHint || *a.OpenWorldHint) {
				t.Errorf("%s: hints %+v", tl.Name, a)
			}
		}
		// The handler shares SDK servers between requests with the same list: a changed list is
		// served at once.
		f.mu.Lock()
		f.hidden = "sleep"
		f.mu.Unlock()
		res, err = cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(res.Tools, func(tl *sdk.Tool) bool { return tl.Name == "sleep" }) || len(res.Tools) != len(names)-1 {
			t.Errorf("after the list changed: %d tools, sleep still listed or another tool gone", len(res.Tools))
		}
	})
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

func TestCallOutcomes(t *testing.T) {
	eachVersion(t, func(t *testing.T, v version, f *fakeCalls, srv *httptest.Server) {
		rec := &recorder{}
		cs := connect(t, srv.URL, rec.options("accept"))
		cases := []struct {
			tool    string
			isError bool
			text    string
			status  call.Status
		}{
			{"echo", false, "hello from default", call.StatusOK},
			{"fail", true, "boom: exit code 2", call.StatusError},
			{"forbidden", true, "denied by rule forbidden-commands: sudo is never allowed", call.StatusDenied},
			{"bad", true, `"text" must be a string`, ""},
		}
		for _, c := range cases {
			res := callTool(t, cs, c.tool, nil)
			if res.IsError != c.isError || !strings.Contains(text(res), c.text) {
				t.Errorf("%s: isError %v, text %q; want %v, %q", c.tool, res.IsError, text(res), c.isError, c.text)
			}
			if c.status != "" && structured(t, res).Status != c.status {
				t.Errorf("%s: structured %+v, want status %s", c.tool, structured(t, res), c.status)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "broken", Arguments: map[string]any{}})
		if err == nil || !strings.Contains(err.Error(), "toolpool failed") {
			t.Errorf("broken: error %v, want a protocol error saying toolpool failed", err)
		}
		if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "nope", Arguments: map[string]any{}}); err == nil {
			t.Error("an unknown tool was not a protocol error")
		}
	})
}

func TestProgressAndWorkspace(t *testing.T) {
	eachVersion(t, func(t *testing.T, v version, f *fakeCalls, srv *httptest.Server) {
		rec := &recorder{}
		cs := connect(t, srv.URL, rec.options("accept"))
		traceparent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		done := make(chan *sdk.CallToolResult, 1)
		go func() {
			done <- callTool(t, cs, "gated", sdk.Meta{"progressToken": "p1", WorkspaceMeta: "ws9", "traceparent": traceparent})
		}()
		rec.waitProgress(t, "line one of") // printed while the call runs: it ends only once released
		close(f.release)
		res := <-done
		id := structured(t, res).ID
		if text(res) != "released" || structured(t, res).Workspace != "ws9" {
			t.Errorf("text %q, %+v: want the gated call's output in the _meta workspace", text(res), structured(t, res))
		}
		progress := rec.waitProgress(t, id+" ok")
		want := []string{"call " + id + " queued: waiting for a worker", "call " + id + " running on w1", "line one of " + id + "\n", "call " + id + " ok"}
		if !slices.Equal(progress, want) {
			t.Errorf("progress %q, want %q", progress, want)
		}
		if _, _, _, traces := f.snapshot(); traces[0] != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("the call's trace is %q, not the _meta traceparent's", traces[0])
		}
		// The header names the workspace when _meta does not.
		hdr := connect(t, srv.URL, nil, WorkspaceHeader, "ws7")
		if res := callTool(t, hdr, "echo", nil); text(res) != "hello from ws7" {
			t.Errorf("with the header: %q", text(res))
		}
	})
}

func TestApprovalByElicitation(t *testing.T) {
	for _, v := range versions {
		for _, answer := range []string{"accept", "decline"} {
			t.Run(v.name+"/"+answer, func(t *testing.T) {
				f := newFake(t)
				srv := server(t, f, testConfig(), v.legacy)
				rec := &recorder{}
				cs := connect(t, srv.URL, rec.options(answer))
				res := callTool(t, cs, "guarded", nil)
				id := structured(t, res).ID
				_, _, decided, _ := f.snapshot()
				if answer == "accept" {
					if res.IsError || text(res) != "hello from default" || !slices.Equal(decided, []string{"approve " + id}) {
						t.Errorf("accepted: isError %v, text %q, decisions %v", res.IsError, text(res), decided)
					}
				} else if !res.IsError || structured(t, res).Status != call.StatusDenied || !slices.Equal(decided, []string{"deny " + id}) {
					t.Errorf("declined: isError %v, %+v, decisions %v", res.IsError, structured(t, res), decided)
				}
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if len(rec.prompts) != 1 || !strings.Contains(rec.prompts[0], "approve guarded in workspace default") || !strings.Contains(rec.prompts[0], `{"text":"hi"}`) {
					t.Errorf("prompts %q", rec.prompts)
				}
			})
		}
	}
}

func TestApprovalWithoutElicitation(t *testing.T) {
	for _, v := range versions {
		for _, approver := range []bool{true, false} {
			t.Run(v.name+map[bool]string{true: "/client cannot elicit", false: "/token cannot approve"}[approver], func(t *testing.T) {
				f := newFake(t)
				f.approver = approver
				srv := server(t, f, testConfig(), v.legacy)
				opts := (&recorder{}).options("accept")
				if approver {
					opts.ElicitationHandler = nil // a client that cannot elicit
				}
				cs := connect(t, srv.URL, opts)
				res := callTool(t, cs, "guarded", nil)
				s := structured(t, res)
				if res.IsError || s.Status != call.StatusPendingApproval || !strings.Contains(text(res), getResultName) || !strings.Contains(text(res), s.ID) {
					t.Fatalf("isError %v, %+v, text %q", res.IsError, s, text(res))
				}
				if _, _, decided, _ := f.snapshot(); len(decided) != 0 {
					t.Fatalf("decided %v without a person", decided)
				}
				// Someone approves elsewhere (the REST API); the model fetches the result.
				f.update(s.ID, func(r *call.Result) { r.Status = call.StatusQueued })
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				got, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: getResultName, Arguments: map[string]any{"id": s.ID}})
				if err != nil || got.IsError || text(got) != "hello from default" {
					t.Errorf("get result: %v, %+v", err, got)
				}
				for _, args := range []map[string]any{{"id": "c_nope"}, {"id": s.ID, "wait_seconds": 301}, {"id": s.ID, "extra": 1}} {
					bad, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: getResultName, Arguments: args})
					if err != nil || !bad.IsError {
						t.Errorf("get result %v: %v, %+v; want a tool error", args, err, bad)
					}
				}
			})
		}
	}
}

func TestCancel(t *testing.T) {
	eachVersion(t, func(t *testing.T, v version, f *fakeCalls, srv *httptest.Server) {
		cs := connect(t, srv.URL, (&recorder{}).options("accept"))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sleep", Arguments: map[string]any{}})
			errc <- err
		}()
		id := waitRunning(t, f)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("the cancelled call returned %v", err)
		}
		wctx, stop := context.WithTimeout(context.WithValue(context.Background(), principalKey{}, principal), 30*time.Second)
		defer stop()
		r, err := f.Wait(wctx, id, func(*call.Result) bool { return false })
		if err != nil || r.Status != call.StatusCancelled {
			t.Fatalf("call after cancel: %+v, %v", r, err)
		}
		submitted, cancelled, _, _ := f.snapshot()
		if !slices.Contains(cancelled, id) {
			t.Errorf("cancelled %v, want %s", cancelled, id)
		}
		if v.legacy && submitted[0].ID != id {
			t.Errorf("a 2025-11-25 call's id %q is not derived from its session and request", submitted[0].ID)
		}
	})
}

// waitRunning returns the id of the first call once it runs.
func waitRunning(t *testing.T, f *fakeCalls) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		f.mu.Lock()
		ch := f.changed
		for id, r := range f.calls {
			if r.Status == call.StatusRunning {
				f.mu.Unlock()
				return id
			}
		}
		f.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("no call ran within 30s")
		}
	}
}

func TestHTTPChecks(t *testing.T) {
	f := newFake(t)
	cfg := testConfig()
	cfg.MaxBodyBytes = 4096
	srv := server(t, f, cfg, false)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"x","version":"1"}}}`
	cases := []struct {
		name   string
		method string
		header map[string]string
		body   string
		code   int
		want   string
	}{
		{"foreign origin", "POST", map[string]string{"Origin": "https://evil.example"}, initialize, 403, "mcp.allowed_origins"},
		{"allowed origin", "POST", map[string]string{"Origin": "https://app.example.com"}, initialize, 200, `"protocolVersion":"2025-11-25"`},
		{"no origin", "POST", nil, initialize, 200, `"serverInfo"`},
		{"bad workspace header", "POST", map[string]string{WorkspaceHeader: "../etc"}, initialize, 400, "Toolpool-Workspace"},
		{"oversized body", "POST", nil, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"` + strings.Repeat("a", 5000) + `"}}`, 413, "4096-byte limit"},
		{"not json", "POST", nil, `{nope`, 400, ""},
		{"get", "GET", nil, "", 405, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, srv.URL, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.code || !strings.Contains(string(body), c.want) {
				t.Errorf("HTTP %d %s; want %d containing %q", resp.StatusCode, body, c.code, c.want)
			}
			if c.name == "no origin" {
				if s := parseSession(resp.Header.Get("Mcp-Session-Id")); !s.elicits {
					t.Errorf("session id %q does not record the client's elicitation", resp.Header.Get("Mcp-Session-Id"))
				}
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*Config)
	}{
		{"origin with a path", func(c *Config) { c.AllowedOrigins = []string{"https://a.example/x"} }},
		{"origin without a scheme", func(c *Config) { c.AllowedOrigins = []string{"a.example"} }},
		{"no max wait", func(c *Config) { c.MaxWait = 0 }},
		{"no approval wait", func(c *Config) { c.ApprovalWait = 0 }},
		{"tiny body", func(c *Config) { c.MaxBodyBytes = 10 }},
	} {
		cfg := DefaultConfig()
		c.mod(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", c.name, cfg)
		}
	}
	cfg := testConfig()
	if err := cfg.Validate(); err != nil {
		t.Errorf("the test config: %v", err)
	}
}

func TestSummaryMatchesOutputSchema(t *testing.T) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(outputSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("out.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("out.json")
	if err != nil {
		t.Fatal(err)
	}
	failed := &call.Result{ID: "c_1", Tool: "run_shell", Workspace: "w", ExitCode: new(1), Decision: &call.Decision{Action: "allow"}}
	failed.Fail(call.StatusError, call.ErrExitCode, "exit 1")
	for _, r := range []*call.Result{failed, {ID: "c_2", Tool: "t", Workspace: "w", Status: call.StatusPendingApproval}} {
		b, _ := json.Marshal(summarize(r))
		var v any
		_ = json.Unmarshal(b, &v)
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
	var bad any
	_ = json.Unmarshal([]byte(`{"id":"c_3","tool":"t","workspace":"w","status":"weird","truncated":false,"output_bytes":0,"timing":{}}`), &bad)
	if sch.Validate(bad) == nil {
		t.Error("the schema accepts an unknown status")
	}
}

// TestForgedRequestState sends 2026-07-28 retries whose requestState names a call they did not start:
// another call's id, or no call; neither may decide anything.
func TestForgedRequestState(t *testing.T) {
	f := newFake(t)
	srv := server(t, f, testConfig(), false)
	ctx := context.WithValue(context.Background(), principalKey{}, principal)
	pending, err := f.Submit(ctx, call.Request{Tool: "guarded", Args: json.RawMessage(`{"text":"rm it"}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, state, args, want string }{
		{"other arguments", approvalState + pending.ID, `{"text":"hi"}`, "belongs to another call"},
		{"not a call id", approvalState + "c_x", `{"text":"rm it"}`, "not one toolpool gave"},
		{"not toolpool's", "opaque", `{"text":"rm it"}`, "not one toolpool gave"},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"guarded","arguments":` + c.args +
				`,"requestState":"` + c.state + `","inputResponses":{"approval":{"action":"accept"}},` +
				`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}}`
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
			req.Header.Set("Mcp-Method", "tools/call")
			req.Header.Set("Mcp-Name", "guarded")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(got), c.want) || !strings.Contains(string(got), `"error"`) {
				t.Errorf("HTTP %d %s; want a protocol error saying %q", resp.StatusCode, got, c.want)
			}
		})
	}
	if _, _, decided, _ := f.snapshot(); len(decided) != 0 {
		t.Errorf("forged states decided %v", decided)
	}
}

// TestDrain: a 2026-07-28 request that the server cuts (its connection closed) cancels its call, unless
// the handler drains (the dispatcher shutting down): then the call runs on.
func TestDrain(t *testing.T) {
	for _, drain := range []bool{false, true} {
		t.Run(map[bool]string{false: "serving", true: "draining"}[drain], func(t *testing.T) {
			f := newFake(t)
			h, err := New(testConfig(), f, f, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			callServed := make(chan struct{}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
				if r.Header.Get("Mcp-Method") == "tools/call" {
					callServed <- struct{}{}
				}
			}))
			defer srv.Close()
			cs := connect(t, srv.URL, nil)
			go func() {
				_, _ = cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "sleep", Arguments: map[string]any{}})
			}()
			id := waitRunning(t, f)
			if drain {
				h.Drain()
			}
			srv.CloseClientConnections()
			select {
			case <-callServed:
			case <-time.After(30 * time.Second):
				t.Fatal("the cut tools/call was still served after 30s")
			}
			_, cancelled, _, _ := f.snapshot()
			if slices.Contains(cancelled, id) == drain {
				t.Errorf("cancelled %v after the cut, draining %v", cancelled, drain)
			}
		})
	}
}
