package dispatcher

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

func TestParsePosition(t *testing.T) {
	tests := []struct {
		id      string
		want    position
		wantErr bool
	}{
		{"", position{}, false},
		{"0.0", position{}, false},
		{"1024.7", position{out: 1024, err: 7}, false},
		{"1024.7.2", position{out: 1024, err: 7, attempt: 2}, false},
		{"1024", position{}, true},
		{"a.b", position{}, true},
		{"-1.0", position{}, true},
		{"1.2.0", position{}, true},
		{"1.2.x", position{}, true},
		{"1.2.3.4", position{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got, err := parsePosition(tt.id)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parsePosition(%q) = %v, %v", tt.id, got, err)
			}
			if err == nil && tt.id != "" && got.String() != tt.id {
				t.Errorf("String() = %q, want %q", got.String(), tt.id)
			}
		})
	}
}

func TestOutputEventIsBinarySafe(t *testing.T) {
	if e := newOutputEvent(3, []byte("héllo")); e.Text != "héllo" || e.Base64 != "" || e.Offset != 3 {
		t.Errorf("text: %+v", e)
	}
	if e := newOutputEvent(0, []byte{0xff, 'a'}); e.Text != "" || e.Base64 != "/2E=" {
		t.Errorf("binary: %+v", e)
	}
}

// fakeLive is a Live whose chunks the test sends, one follower at a time: followed gets a value as each
// follower starts, and stopped is closed when the first one's context ends.
type fakeLive struct {
	chunks   chan queue.Chunk
	followed chan struct{}
	stopped  chan struct{}
	once     sync.Once
}

func (l *fakeLive) FollowOutput(ctx context.Context, _ string, _ int) (<-chan queue.Chunk, error) {
	l.followed <- struct{}{}
	out := make(chan queue.Chunk)
	go func() {
		defer l.once.Do(func() { close(l.stopped) })
		defer close(out)
		for {
			select {
			case ch := <-l.chunks:
				select {
				case out <- ch:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// eventReader opens GET /v1/calls/{id}/events with Last-Event-ID lastID ("" for none) and returns what
// reads its next event.
func eventReader(t *testing.T, ctx context.Context, srv *httptest.Server, id, lastID string) func() (id, name, data string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/calls/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+acmeCaller)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	sc := bufio.NewScanner(resp.Body)
	return func() (id, name, data string) {
		t.Helper()
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && name != "":
				return id, name, data
			case strings.HasPrefix(line, "id: "):
				id = line[4:]
			case strings.HasPrefix(line, "event: "):
				name = line[7:]
			case strings.HasPrefix(line, "data: "):
				data = line[6:]
			}
		}
		t.Fatalf("the event stream ended (%v)", sc.Err())
		return
	}
}

// TestEventsLiveThenGap: GET /v1/calls/{id}/events of a running call follows the live output from the
// position of Last-Event-ID (what the live stream retains is read from its first byte, and what the
// reader has is skipped), with its image's pull as status events; at a gap (bytes the live stream does
// not have) it says exactly which bytes are missing, stops reading the live output while the call still
// runs, and ends with the result once the call does.
func TestEventsLiveThenGap(t *testing.T) {
	live := &fakeLive{chunks: make(chan queue.Chunk), followed: make(chan struct{}, 1), stopped: make(chan struct{})}
	h := newHarness(t, setup{live: live})
	id := h.queued("acme", call.StatusRunning)
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next := eventReader(t, ctx, srv, id, "2.0")
	<-live.followed
	if _, name, _ := next(); name != "status" {
		t.Fatalf("first event %s, want status", name)
	}
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 0, Data: []byte("ab")} // the reader has it
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 2, Data: []byte("cd")}
	if id, name, data := next(); id != "4.0" || name != "stdout" || data != `{"offset":2,"text":"cd"}` {
		t.Fatalf("event %s %s %s, want stdout cd at 2 with id 4.0", id, name, data)
	}
	// The image's pull, reported on the live stream: a status event per report, the position unchanged.
	live.chunks <- queue.Chunk{Stream: call.StreamPull, Offset: 0, Data: []byte(`{"image":"r/x:1","bytes_done":10,"bytes_total":40,"phase":"fetching"}` + "\n" +
		`{"image":"r/x:1","bytes_done":40,"bytes_total":40,"phase":"done"}` + "\n")}
	for _, want := range []string{`"pull":{"image":"r/x:1","bytes_done":10,"bytes_total":40,"phase":"fetching"}`, `"pull":{"image":"r/x:1","bytes_done":40,"bytes_total":40,"phase":"done"}`} {
		if id, name, data := next(); id != "4.0" || name != "status" || !strings.Contains(data, `"status":"running"`) || !strings.Contains(data, want) {
			t.Fatalf("event %s %s %s, want a running status with %s at 4.0", id, name, data, want)
		}
	}
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 10, Data: []byte("xyz")}
	_, name, data := next()
	var lag lagEvent
	if err := json.Unmarshal([]byte(data), &lag); err != nil || name != "lag" || lag.Stream != "stdout" || lag.Offset != 4 || lag.Missing != 6 ||
		!strings.Contains(lag.Message, "stdout bytes 4 to 10 are not in the live stream") {
		t.Fatalf("event %s %s, want a lag of stdout bytes 4 to 10", name, data)
	}
	select {
	case <-live.stopped:
	case <-ctx.Done():
		t.Fatal("the live output is still read after the gap")
	}
	rec, err := h.store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Result.Status = call.StatusOK
	h.store.Put(rec.Result)
	if _, name, data := next(); name != "status" || !strings.Contains(data, `"ok"`) {
		t.Fatalf("event %s %s, want the status ok", name, data)
	}
	if id, name, _ := next(); name != "result" || id != "4.0" {
		t.Fatalf("event %s with id %s, want the result at 4.0", name, id)
	}
}

// TestEventsRestartWhenTheCallRunsAgain: a call run again after its worker was lost prints from byte 0
// again. A reader following the first attempt gets a "restart" event and then the new attempt's output
// from its first byte (not appended after, nor spliced into, what it had); a late chunk of the lost
// attempt is dropped; and a reader that comes back with an id of the earlier attempt starts over at once.
func TestEventsRestartWhenTheCallRunsAgain(t *testing.T) {
	live := &fakeLive{chunks: make(chan queue.Chunk), followed: make(chan struct{}, 2), stopped: make(chan struct{})}
	h := newHarness(t, setup{live: live})
	id := h.queued("acme", call.StatusRunning)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setAttempt := func(n uint64) {
		t.Helper()
		rec, err := h.store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		rec.Result.Attempt = n
		h.store.Put(rec.Result)
	}
	setAttempt(1)
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	next := eventReader(t, ctx, srv, id, "")
	<-live.followed
	if id, name, _ := next(); name != "status" || id != "0.0.1" {
		t.Fatalf("first event %s at %s, want status at 0.0.1", name, id)
	}
	expect := func(wantID, wantName, wantData string) {
		t.Helper()
		if id, name, data := next(); id != wantID || name != wantName || !strings.Contains(data, wantData) {
			t.Fatalf("event %s %s %s, want %s %s with %s", id, name, data, wantID, wantName, wantData)
		}
	}
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 0, Data: []byte("first run\n"), Attempt: 1}
	expect("10.0.1", "stdout", `"text":"first run\n"`)
	live.chunks <- queue.Chunk{Stream: call.StreamStderr, Offset: 0, Data: []byte("warn\n"), Attempt: 1}
	expect("10.5.1", "stderr", `"text":"warn\n"`)

	setAttempt(2)
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 0, Data: []byte("again"), Attempt: 2}
	expect("0.0.2", "restart", `"attempt":2`)
	expect("5.0.2", "stdout", `{"offset":0,"text":"again"}`)
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 10, Data: []byte("late"), Attempt: 1} // the lost run's
	live.chunks <- queue.Chunk{Stream: call.StreamStdout, Offset: 5, Data: []byte("!\n"), Attempt: 2}
	expect("7.0.2", "stdout", `{"offset":5,"text":"!\n"}`)

	// Back with an id of the first attempt: told at once, before the status.
	next = eventReader(t, ctx, srv, id, "10.5.1")
	<-live.followed
	expect("0.0.2", "restart", `"message":"the call is running again (attempt 2)`)
	expect("0.0.2", "status", `"status":"running"`)
	// An id as sent before ids carried the attempt is taken as of the attempt running.
	next = eventReader(t, ctx, srv, id, "5.0")
	<-live.followed
	expect("5.0.2", "status", `"status":"running"`)
}
