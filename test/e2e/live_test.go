package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// tickCommand prints tick-1 to tick-6, a second apart, each with the time it was printed (ns).
const tickCommand = `for i in 1 2 3 4 5 6; do echo "tick-$i $(date +%s%N)"; sleep 1; done`

// tick is one line of tickCommand as a reader got it: when it was printed, and when its last byte came.
type tick struct {
	n                 int
	printed, received time.Time
}

// liveReader follows a call's events, over one connection or several (resumed with Last-Event-ID).
type liveReader struct {
	name   string
	stdout []byte
	parsed int // the bytes of stdout split into ticks
	ticks  []tick
	lastID string
	ended  bool // the result event came
	// onTick, if set, is called with each tick as it is complete (from the reading goroutine).
	onTick func(tick)
}

// read follows req until the result event or until req's context ends (a dropped connection). Every
// stdout event must start where the previous one ended: no gap, no duplicate, across reconnections.
func (r *liveReader) read(t *testing.T, req *http.Request) {
	t.Helper()
	events(t, req, func(ev sseEvent) bool {
		r.lastID = ev.id
		switch ev.name {
		case "lag", "stderr", "error":
			t.Errorf("%s: unexpected %s event %s", r.name, ev.name, ev.data)
		case "stdout":
			off, b := outputBytes(t, ev)
			if off != int64(len(r.stdout)) {
				t.Errorf("%s: stdout event at offset %d after %d bytes: a gap or a duplicate", r.name, off, len(r.stdout))
				return false
			}
			r.stdout = append(r.stdout, b...)
			for {
				i := bytes.IndexByte(r.stdout[r.parsed:], '\n')
				if i < 0 {
					break
				}
				line := string(r.stdout[r.parsed : r.parsed+i])
				r.parsed += i + 1
				var tk tick
				var ns int64
				if _, err := fmt.Sscanf(line, "tick-%d %d", &tk.n, &ns); err != nil {
					t.Errorf("%s: line %q is not a tick", r.name, line)
					continue
				}
				tk.printed, tk.received = time.Unix(0, ns), ev.at
				r.ticks = append(r.ticks, tk)
				if r.onTick != nil {
					r.onTick(tk)
				}
			}
		case "result":
			r.ended = true
			return false
		}
		return true
	})
}

// checkJoined checks a reader that joined at joined: the ticks printed before it came at once (within a
// second of joining: a request, a lookup, a consumer), tick-1 and tick-2 among them, and every later one
// within 250 ms of its print.
func checkJoined(t *testing.T, r *liveReader, joined time.Time) {
	t.Helper()
	before := 0
	for _, tk := range r.ticks {
		late := tk.received.Sub(tk.printed)
		switch {
		case tk.printed.Before(joined):
			before++
			late = tk.received.Sub(joined)
			if late > time.Second {
				t.Errorf("%s: tick-%d, printed before the reader joined, came %s after it joined", r.name, tk.n, late.Round(time.Millisecond))
			}
		case late > 250*time.Millisecond:
			t.Errorf("%s: tick-%d came %s after it was printed, want within 250ms", r.name, tk.n, late.Round(time.Millisecond))
		}
		t.Logf("%s: tick-%d came %s after it was printed or the reader joined, whichever is later", r.name, tk.n, late.Round(time.Millisecond))
	}
	if before < 2 {
		t.Errorf("%s: %d ticks were printed before it joined, want at least tick-1 and tick-2", r.name, before)
	}
}

// TestLiveReadersJoinAnyTime: while a call prints a tick a second, a reader joining 1.5 s after the first
// tick (about 2 s into the call) gets tick-1 and tick-2 at once and every later tick within 250 ms of its
// print; so does a reader joining later on another dispatcher replica; a reader that drops at 2.5 s and
// comes back with Last-Event-ID a second later gets exactly the bytes it missed, at once, then the rest
// live. Every reader ends with the call's whole stdout, byte for byte.
func TestLiveReadersJoinAnyTime(t *testing.T) {
	s := startStack(t)
	url2 := s.secondDispatcher(t)
	res := s.shell(t, "alpha-token", "live", tickCommand, map[string]any{"wait": false}).result(t)
	if res.ID == "" {
		t.Fatalf("no call id in the answer: %+v", res)
	}
	path := "/v1/calls/" + res.ID + "/events"
	var wg sync.WaitGroup
	follow := func(r *liveReader, req *http.Request) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.read(t, req)
		}()
	}

	// A follows from the start: its first tick is the time the others go by.
	firstTick := make(chan time.Time, 1)
	a := &liveReader{name: "the reader that drops", onTick: func(tk tick) {
		if tk.n == 1 {
			firstTick <- tk.printed
		}
	}}
	aCtx, drop := context.WithCancel(context.Background())
	defer drop()
	var aDone sync.WaitGroup
	aDone.Add(1)
	go func() {
		defer aDone.Done()
		a.read(t, s.request(t, http.MethodGet, path, "alpha-token", nil).WithContext(aCtx))
	}()
	var first time.Time
	select {
	case first = <-firstTick:
	case <-time.After(2 * time.Minute):
		t.Fatal("no tick in two minutes")
	}

	// B joins at +1.5 s (tick-1 and tick-2 printed), C on the other replica at +2.2 s.
	time.Sleep(time.Until(first.Add(1500 * time.Millisecond)))
	b := &liveReader{name: "the reader joining late"}
	bJoined := time.Now()
	follow(b, s.request(t, http.MethodGet, path, "alpha-token", nil))
	time.Sleep(time.Until(first.Add(2200 * time.Millisecond)))
	c := &liveReader{name: "the reader on the other replica"}
	req := s.request(t, http.MethodGet, path, "alpha-token", nil)
	req.URL, _ = req.URL.Parse(url2 + path)
	cJoined := time.Now()
	follow(c, req)

	// A drops at +2.5 s and comes back at +3.5 s, having missed tick-4.
	time.Sleep(time.Until(first.Add(2500 * time.Millisecond)))
	drop()
	aDone.Wait()
	had := len(a.ticks)
	time.Sleep(time.Until(first.Add(3500 * time.Millisecond)))
	if a.lastID == "" || a.ended {
		t.Fatalf("the reader that drops has event id %q, ended %v", a.lastID, a.ended)
	}
	req = s.request(t, http.MethodGet, path, "alpha-token", nil)
	req.Header.Set("Last-Event-ID", a.lastID)
	back := time.Now()
	follow(a, req)
	wg.Wait()

	full := s.do(t, http.MethodGet, "/v1/calls/"+res.ID+"/stdout", "alpha-token", nil)
	for _, r := range []*liveReader{a, b, c} {
		if !r.ended || !bytes.Equal(r.stdout, full.body) || len(r.ticks) != 6 {
			t.Errorf("%s: ended %v with %d ticks, %d bytes of stdout; the call's stdout is %d bytes (HTTP %d), equal %v",
				r.name, r.ended, len(r.ticks), len(r.stdout), len(full.body), full.code, bytes.Equal(r.stdout, full.body))
		}
	}
	checkJoined(t, b, bJoined)
	checkJoined(t, c, cJoined)
	missed := 0
	for _, tk := range a.ticks[had:] {
		late := tk.received.Sub(tk.printed)
		if tk.printed.Before(back) {
			missed++
			late = tk.received.Sub(back)
			if late > time.Second {
				t.Errorf("%s: tick-%d, missed while away, came %s after it came back, want at once", a.name, tk.n, late.Round(time.Millisecond))
			}
		} else if late > 250*time.Millisecond {
			t.Errorf("%s: tick-%d came %s after it was printed, want within 250ms", a.name, tk.n, late.Round(time.Millisecond))
		}
		t.Logf("%s: tick-%d came %s after it was printed or the reader came back, whichever is later", a.name, tk.n, late.Round(time.Millisecond))
	}
	if missed == 0 {
		t.Errorf("%s: no tick was printed while it was away (it had %d): the scenario's timing is off", a.name, had)
	}
}
