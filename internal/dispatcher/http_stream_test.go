package dispatcher

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
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
		{"1024.7", position{1024, 7}, false},
		{"1024", position{}, true},
		{"a.b", position{}, true},
		{"-1.0", position{}, true},
		{"1.2.3", position{}, true},
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

// fakeLive is a Live whose chunks the test sends, one follower at a time: from receives the offsets the
// follower asked for, and stopped is closed when its context ends.
type fakeLive struct {
	chunks  chan queue.Chunk
	from    chan queue.Offsets
	stopped chan struct{}
}

func (l *fakeLive) FollowOutput(ctx context.Context, _ string, from queue.Offsets, _ int) (<-chan queue.Chunk, error) {
	l.from <- from
	out := make(chan queue.Chunk)
	go func() {
		defer close(l.stopped)
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

// TestEventsLiveThenGap: GET /v1/calls/{id}/events of a running call follows the live output from the
// position of Last-Event-ID, with its image's pull as status events; at a gap (bytes the live stream does not have) it says exactly which bytes
// are missing, stops reading the live output while the call still runs, and ends with the result once
// the call does.
func TestEventsLiveThenGap(t *testing.T) {
	live := &fakeLive{chunks: make(chan queue.Chunk), from: make(chan queue.Offsets, 1), stopped: make(chan struct{})}
	h := newHarness(t, setup{live: live})
	id := h.queued("acme", call.StatusRunning)
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/calls/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+acmeCaller)
	req.Header.Set("Last-Event-ID", "2.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	next := func() (id, name, data string) {
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
	if from := <-live.from; from[call.StreamStdout] != 2 || from[call.StreamStderr] != 0 {
		t.Fatalf("followed from %v, want stdout 2 and stderr 0 (Last-Event-ID 2.0)", from)
	}
	if _, name, _ := next(); name != "status" {
		t.Fatalf("first event %s, want status", name)
	}
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
