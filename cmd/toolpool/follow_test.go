package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestCallFollow: --follow prints output events as they come (base64 ones decoded to their bytes, stderr
// to stderr), and when the stream breaks before the result it resumes with Last-Event-ID from the last
// event it read, then prints the result's summary without printing the output twice.
func TestCallFollow(t *testing.T) {
	var mu sync.Mutex
	var resumedFrom []string
	serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" {
			t.Errorf("%s %s without Accept: text/event-stream", r.Method, r.URL.Path)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/calls":
			fmt.Fprint(w, "id: 0.0\nevent: status\ndata: {\"id\":\"c_1\",\"status\":\"running\"}\n\n")
			fmt.Fprint(w, "id: 6.0\nevent: stdout\ndata: {\"offset\":0,\"text\":\"hello\\n\"}\n\n")
			fmt.Fprint(w, "id: 8.0\nevent: stdout\ndata: {\"offset\":6,\"base64\":\"/w0=\"}\n\n")
			// the connection breaks here
		case r.Method == http.MethodGet && r.URL.Path == "/v1/calls/c_1/events":
			mu.Lock()
			resumedFrom = append(resumedFrom, r.Header.Get("Last-Event-ID"))
			mu.Unlock()
			fmt.Fprint(w, "id: 8.4\nevent: stderr\ndata: {\"offset\":0,\"text\":\"oops\"}\n\n")
			fmt.Fprintf(w, "id: 8.4\nevent: result\ndata: %s\n\n", strings.ReplaceAll(okResult, "\n", ""))
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			http.NotFound(w, r)
		}
	}))
	code, stdout, stderr := cli("call", "run_shell", "--follow", "command=echo hello")
	if code != 0 || stdout != "hello\n\xff\r" || !strings.HasPrefix(stderr, "oops[ok · exit 0") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if len(resumedFrom) != 1 || resumedFrom[0] != "8.0" {
		t.Errorf("resumed from %q, want once from the last event id 8.0", resumedFrom)
	}
}

// TestFollowResumesAfterEachCut: `toolpool follow` of a long call whose stream is cut again and again
// (a proxy that closes streams) resumes every time from the last event id it read, prints each byte
// once (bytes a resumed stream sends again are not printed twice), and prints the result at the end.
func TestFollowResumesAfterEachCut(t *testing.T) {
	const cuts = 30
	var mu sync.Mutex
	var resumedFrom []string
	serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/calls/c_1/events" {
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		n := len(resumedFrom)
		resumedFrom = append(resumedFrom, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if n == 0 {
			fmt.Fprint(w, "id: 0.0\nevent: status\ndata: {\"id\":\"c_1\",\"status\":\"running\"}\n\n")
		}
		// Each stream sends the previous line again (a replica that resent it) and one new line, then breaks.
		line := func(i int) string { return fmt.Sprintf("tick-%02d\n", i) } // 8 bytes
		if n > 0 {
			fmt.Fprintf(w, "id: %d.0\nevent: stdout\ndata: {\"offset\":%d,\"text\":%q}\n\n", 8*(n+1), 8*(n-1), line(n-1)+line(n))
		} else {
			fmt.Fprintf(w, "id: 8.0\nevent: stdout\ndata: {\"offset\":0,\"text\":%q}\n\n", line(0))
		}
		if n == cuts {
			fmt.Fprintf(w, "id: %d.0\nevent: result\ndata: %s\n\n", 8*(n+1), strings.ReplaceAll(okResult, "\n", ""))
		}
	}))
	code, stdout, stderr := cli("follow", "c_1")
	var want strings.Builder
	for i := 0; i <= cuts; i++ {
		fmt.Fprintf(&want, "tick-%02d\n", i)
	}
	if code != 0 || stdout != want.String() || !strings.HasPrefix(stderr, "[ok · exit 0") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, from := range resumedFrom {
		if want := fmt.Sprintf("%d.0", 8*i); i > 0 && from != want {
			t.Fatalf("stream %d resumed from %q, want %q", i, from, want)
		}
	}
}

// TestFollowShowsPullProgress: status events that carry the pull of the call's image are shown on stderr,
// once per phase and tenth of the image's bytes (a resumed stream's repeats are not shown again); the
// output and the result are as without them.
func TestFollowShowsPullProgress(t *testing.T) {
	serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		pull := func(done int, phase string) {
			fmt.Fprintf(w, "id: 0.0\nevent: status\ndata: {\"id\":\"c_1\",\"status\":\"running\",\"pull\":{\"image\":\"r/py:3\",\"bytes_done\":%d,\"bytes_total\":4000000,\"phase\":%q}}\n\n", done, phase)
		}
		fmt.Fprint(w, "id: 0.0\nevent: status\ndata: {\"id\":\"c_1\",\"status\":\"running\"}\n\n")
		pull(0, "fetching")
		pull(2000000, "fetching")
		pull(2100000, "fetching") // the same tenth: not shown
		pull(2000000, "fetching")
		pull(4000000, "unpacking")
		pull(4000000, "done")
		fmt.Fprint(w, "id: 3.0\nevent: stdout\ndata: {\"offset\":0,\"text\":\"hi\\n\"}\n\n")
		fmt.Fprintf(w, "id: 3.0\nevent: result\ndata: %s\n\n", strings.ReplaceAll(okResult, "\n", ""))
	}))
	code, stdout, stderr := cli("follow", "c_1")
	want := "[toolpool: pulling image r/py:3: 0.0 MB of 4.0 MB (0%)]\n" +
		"[toolpool: pulling image r/py:3: 2.0 MB of 4.0 MB (50%)]\n" +
		"[toolpool: unpacking image r/py:3: 4.0 MB]\n" +
		"[toolpool: pulled image r/py:3: 4.0 MB]\n"
	if code != 0 || stdout != "hi\n" || !strings.HasPrefix(stderr, want+"[ok · exit 0") {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant it to start with:\n%s", code, stdout, stderr, want)
	}
}

// TestFollowRestart: a call run again after its worker was lost restarts its output. The CLI says so and
// prints the new attempt's output from its first byte (it would otherwise skip as printed the bytes the
// first attempt had printed), and a stream cut after the restart resumes from the id with the attempt.
func TestFollowRestart(t *testing.T) {
	var mu sync.Mutex
	var resumedFrom []string
	serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(resumedFrom)
		resumedFrom = append(resumedFrom, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if n == 0 {
			fmt.Fprint(w, "id: 0.0.1\nevent: status\ndata: {\"id\":\"c_1\",\"status\":\"running\"}\n\n")
			fmt.Fprint(w, "id: 12.0.1\nevent: stdout\ndata: {\"offset\":0,\"text\":\"first run 1\\n\"}\n\n")
			fmt.Fprint(w, "id: 0.0.2\nevent: restart\ndata: {\"attempt\":2,\"message\":\"the call is running again (attempt 2)\"}\n\n")
			fmt.Fprint(w, "id: 6.0.2\nevent: stdout\ndata: {\"offset\":0,\"text\":\"again\\n\"}\n\n")
			return // cut
		}
		fmt.Fprint(w, "id: 6.0.2\nevent: stdout\ndata: {\"offset\":0,\"text\":\"again\\n\"}\n\n") // resent
		fmt.Fprint(w, "id: 11.0.2\nevent: stdout\ndata: {\"offset\":6,\"text\":\"done\\n\"}\n\n")
		fmt.Fprintf(w, "id: 11.0.2\nevent: result\ndata: %s\n\n", strings.ReplaceAll(okResult, "\n", ""))
	}))
	code, stdout, stderr := cli("follow", "c_1")
	if want := "first run 1\nagain\ndone\n"; code != 0 || stdout != want {
		t.Errorf("exit %d, stdout %q, want %q (stderr %q)", code, stdout, want, stderr)
	}
	if !strings.Contains(stderr, "[toolpool: the call is running again (attempt 2)]") {
		t.Errorf("stderr %q, want the restart said", stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(resumedFrom) != 2 || resumedFrom[1] != "6.0.2" {
		t.Errorf("streams resumed from %q, want the second from 6.0.2", resumedFrom)
	}
}
