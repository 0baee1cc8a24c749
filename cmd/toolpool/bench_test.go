package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// benchAPI is a dispatcher for bench: each POSTed call gets an id and is answered queued, then final on
// its first long poll; reads after that answer the call's final status, or reread when set.
type benchAPI struct {
	benchConfig
	t      *testing.T
	mu     sync.Mutex
	n      int
	bodies map[string]int // calls posted, by tool and arguments
	polled map[string]int // long polls, by call id
}

type benchConfig struct {
	final   call.Status
	reread  call.Status // when set, what a plain read answers instead of the final status
	postErr int         // when set, POST /v1/calls answers this error code
}

func (b *benchAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	result := func(code int, id string, st call.Status) {
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"id":%q,"tool":"run_shell","status":%q}`, id, st)
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/calls":
		data, _ := io.ReadAll(r.Body)
		var body struct {
			Tool      string          `json:"tool"`
			Workspace string          `json:"workspace"`
			Args      json.RawMessage `json:"args"`
		}
		if err := json.Unmarshal(data, &body); err != nil || body.Workspace != "bench" {
			b.t.Errorf("bench posted %s", data)
		}
		b.bodies[body.Tool+" "+string(body.Args)]++
		if b.postErr != 0 {
			w.WriteHeader(b.postErr)
			io.WriteString(w, `{"error":{"type":"internal","message":"toolpool could not queue the call"}}`)
			return
		}
		b.n++
		result(http.StatusAccepted, fmt.Sprintf("c_%d", b.n), call.StatusQueued)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/calls/c_"):
		id := strings.TrimPrefix(r.URL.Path, "/v1/calls/")
		if r.URL.Query().Get("wait") == "60s" {
			b.polled[id]++
			result(http.StatusOK, id, b.final)
			return
		}
		st := b.final
		if b.reread != "" {
			st = b.reread
		}
		result(http.StatusOK, id, st)
	default:
		b.t.Errorf("unexpected %s %s", r.Method, r.URL)
		w.WriteHeader(http.StatusNotFound)
	}
}

// TestBench: bench makes the calls of its mix, follows each to its final state, reports throughput,
// latency and final states, and fails when a call has no single final state or a request failed.
func TestBench(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		api     benchConfig
		code    int
		stdout  []string
		bodies  map[string]int
		polled  int // calls followed with a long poll
		noCalls bool
	}{
		{name: "every call has one final state", args: []string{"--requests", "6", "--concurrency", "2", "--mix", "shell=1"},
			api:  benchConfig{final: call.StatusOK},
			code: 0, polled: 6, bodies: map[string]int{`run_shell {"command":"echo ok"}`: 6},
			stdout: []string{"calls        6 in ", "at concurrency 2\n", "throughput   ", "latency      p50 ", "final states ok 6\n",
				"exactly one final state for 6 of 6 calls\n"}},
		{name: "the mix names the calls", args: []string{"--requests", "8", "--mix", "list=1,glob=1"},
			api:  benchConfig{final: call.StatusOK},
			code: 0, polled: 8, stdout: []string{"final states ok 8\n"}},
		{name: "a call whose final state changes is a problem", args: []string{"--requests", "3", "--concurrency", "1"},
			api:  benchConfig{final: call.StatusOK, reread: call.StatusError},
			code: 1, polled: 3, stdout: []string{"PROBLEM call c_1 was ok, now reads error"}},
		{name: "failed requests fail the bench", args: []string{"--requests", "2"},
			api:  benchConfig{postErr: http.StatusServiceUnavailable},
			code: 1, stdout: []string{"final states request_error 2\n", "request error ", "exactly one final state for 0 of 0 calls"}},
		{name: "an unknown mix is a usage error", args: []string{"--mix", "shell,compile=2"}, code: 2, noCalls: true},
		{name: "a weight that is not a number is a usage error", args: []string{"--mix", "shell=many"}, code: 2, noCalls: true},
		{name: "no concurrency is a usage error", args: []string{"--concurrency", "0"}, code: 2, noCalls: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &benchAPI{benchConfig: tt.api, t: t, bodies: map[string]int{}, polled: map[string]int{}}
			serve(t, api)
			code, stdout, stderr := cli(append([]string{"bench", "--duration", "1m"}, tt.args...)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			api.mu.Lock()
			defer api.mu.Unlock()
			if tt.noCalls && len(api.bodies) != 0 {
				t.Errorf("a usage error made calls: %v", api.bodies)
			}
			if tt.bodies != nil && fmt.Sprint(api.bodies) != fmt.Sprint(tt.bodies) {
				t.Errorf("posted %v, want %v", api.bodies, tt.bodies)
			}
			if len(api.polled) != tt.polled {
				t.Errorf("followed %d calls to their end, want %d", len(api.polled), tt.polled)
			}
		})
	}
}
