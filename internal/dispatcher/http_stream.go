package dispatcher

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// The handlers of a call's output: GET /v1/calls/{id}/events (and POST /v1/calls with Accept:
// text/event-stream), Server-Sent Events with the call's status and output as printed; and GET
// /v1/calls/{id}/stdout and /stderr, a finished call's full stream by range (readStream, stream.go).

const (
	// followBuffer bounds the chunks waiting for one follower: at most 16 x 64 KiB (the live stream
	// holds the rest).
	followBuffer = 16
	// eventPiece bounds the bytes of one output event read from the store.
	eventPiece = 64 << 10
	// keepAlive is how often an idle event stream gets a comment line, so that proxies keep it open.
	keepAlive = 15 * time.Second
	// rangeDefault and rangeMax are the default and largest limit of a range read.
	rangeDefault = 1 << 20
	rangeMax     = 16 << 20
)

// position is how far a follower has read each stream of the call's attempt (call.Result's Attempt; 0:
// not known yet); it is the id of every event ("<stdout bytes>.<stderr bytes>.<attempt>", or without
// the attempt while none is known), so a client that reconnects with Last-Event-ID resumes there, and
// starts over when the call has been run again since.
type position struct {
	out, err int64
	attempt  uint64
}

func (p position) String() string {
	id := strconv.FormatInt(p.out, 10) + "." + strconv.FormatInt(p.err, 10)
	if p.attempt > 0 {
		id += "." + strconv.FormatUint(p.attempt, 10)
	}
	return id
}

func (p *position) at(stream string) *int64 {
	if stream == call.StreamStderr {
		return &p.err
	}
	return &p.out
}

// parsePosition reads an event id; "" is the start. An id without an attempt (as this stream sent
// before calls carried one) is taken as of the attempt running.
func parsePosition(id string) (position, error) {
	if id == "" {
		return position{}, nil
	}
	parts := strings.Split(id, ".")
	var p position
	var err1, err2, err3 error
	if len(parts) == 2 || len(parts) == 3 {
		p.out, err1 = strconv.ParseInt(parts[0], 10, 64)
		p.err, err2 = strconv.ParseInt(parts[1], 10, 64)
		if len(parts) == 3 {
			p.attempt, err3 = strconv.ParseUint(parts[2], 10, 64)
		}
	}
	if len(parts) < 2 || len(parts) > 3 || err1 != nil || err2 != nil || err3 != nil || p.out < 0 || p.err < 0 || (len(parts) == 3 && p.attempt == 0) {
		return position{}, fmt.Errorf("Last-Event-ID %q is not an event id of this stream: ids are \"<stdout bytes>.<stderr bytes>.<attempt>\" such as \"1024.0.1\"; send the id of the last event you received, or none to start over", id)
	}
	return p, nil
}

// restartEvent is the data of a "restart" event: the call is running again, as attempt Attempt, after
// the worker of the attempt this reader followed was lost; its stdout and stderr start over from byte
// 0, and what this reader got of them before is not the call's output.
type restartEvent struct {
	Attempt uint64 `json:"attempt"`
	Message string `json:"message"`
}

// restart moves pos to the start of attempt attempt and tells the reader, when attempt is later than
// the one pos is in; when pos is in no known attempt yet, it takes attempt as its own. It reports whether
// the reader was told.
func restart(ev *sse, pos *position, attempt uint64) (bool, error) {
	switch {
	case attempt == 0 || attempt <= pos.attempt:
		return false, nil
	case pos.attempt == 0:
		pos.attempt = attempt
		return false, nil
	}
	*pos = position{attempt: attempt}
	return true, ev.send(pos.String(), "restart", restartEvent{Attempt: attempt, Message: fmt.Sprintf(
		"the call is running again (attempt %d): the worker running it was lost, and its output starts over from byte 0; discard what this stream sent of stdout and stderr before", attempt)})
}

// outputEvent is the data of a "stdout" or "stderr" event: bytes of the stream from offset on, as text
// when they are valid UTF-8, otherwise (binary output) as base64, so that no byte is ever lost or
// altered by JSON.
type outputEvent struct {
	Offset int64  `json:"offset"`
	Text   string `json:"text,omitempty"`
	Base64 string `json:"base64,omitempty"`
}

func newOutputEvent(offset int64, b []byte) outputEvent {
	if utf8.Valid(b) {
		return outputEvent{Offset: offset, Text: string(b)}
	}
	return outputEvent{Offset: offset, Base64: base64.StdEncoding.EncodeToString(b)}
}

// sse writes Server-Sent Events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	// The server's read timeout is for reading requests; an event stream outlives it.
	_ = e.rc.SetReadDeadline(time.Time{})
	_ = e.flush()
	return e
}

func (e *sse) flush() error { return e.rc.Flush() }

// send writes one event; an error means the client is gone.
func (e *sse) send(id, event string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", event, err)
	}
	// Events may be large; never let a slow client hold a handler forever.
	_ = e.rc.SetWriteDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(e.w, "id: %s\nevent: %s\ndata: %s\n\n", id, event, b); err != nil {
		return err
	}
	return e.flush()
}

func (e *sse) ping() error {
	_ = e.rc.SetWriteDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(e.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	return e.flush()
}

// statusEvent is the data of a "status" event. Pull, while a running call waits for its image, says how
// far the pull is.
type statusEvent struct {
	ID     string             `json:"id"`
	Status call.Status        `json:"status"`
	Worker string             `json:"worker,omitempty"`
	Pull   *call.PullProgress `json:"pull,omitempty"`
}

// lagEvent says that live output of a stream has a gap at this reader's position: Missing bytes from
// Offset on are not in the live stream (the call printed more than it keeps, or faster than the worker
// could publish). Live output stops for this reader; the rest of both streams, from the event's id,
// comes from the output store, in order, once the call ends.
type lagEvent struct {
	Stream  string `json:"stream"`
	Offset  int64  `json:"offset"`
	Missing int64  `json:"missing"`
	Message string `json:"message"`
}

func (s *api) getEvents(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	id := r.PathValue("id")
	last := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query().Get("last_event_id"); q != "" && last == "" {
		last = q
	}
	pos, err := parsePosition(last)
	if err != nil {
		writeErr(w, invalid("%v", err))
		return
	}
	s.follow(w, r, p.tenant, id, pos)
}

// wantsEvents reports whether a request asks for Server-Sent Events.
func wantsEvents(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// follow streams call id as Server-Sent Events until it ends or the client leaves: a "status" event for
// each status it takes, "stdout" and "stderr" events with its output, and a "result" event with the final
// envelope, after which the stream closes. It starts after pos: a running call's output comes from the
// live stream (what it retains, then as printed), so a reader that joins or comes back at any moment
// misses nothing; output that live delivery does not have (not retained) comes from the output store once
// the call ends, in order, so that a follower gets every byte kept exactly once.
func (s *api) follow(w http.ResponseWriter, r *http.Request, tenant, id string, pos position) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rec, rerr := s.lookup(ctx, tenant, id)
	if rerr != nil {
		writeErr(w, rerr)
		return
	}
	res := s.expireIfDue(ctx, rec)
	var chunks <-chan queue.Chunk
	liveCtx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	if s.live != nil && !res.Status.Terminal() {
		var err error
		// From the first byte retained: the chunks this reader has are skipped here (sendLive), where the
		// attempt pos is in is known.
		if chunks, err = s.live.FollowOutput(liveCtx, id, followBuffer); err != nil {
			s.log.ErrorContext(ctx, "follow output", "call_id", id, "error", err)
			writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not follow the call's output; retry"))
			return
		}
	}
	ev := startSSE(w)
	live := map[string]bool{call.StreamStdout: true, call.StreamStderr: true}
	if _, err := restart(ev, &pos, res.Attempt); err != nil {
		return
	}
	if ev.send(pos.String(), "status", statusEvent{ID: id, Status: res.Status, Worker: res.Worker}) != nil {
		return
	}
	updates := s.watch(ctx, id, res.Status)
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for !res.Status.Terminal() {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			err = ev.ping()
		case next, ok := <-updates:
			if !ok {
				return
			}
			res = next
			err = ev.send(pos.String(), "status", statusEvent{ID: id, Status: res.Status, Worker: res.Worker})
		case ch, ok := <-chunks:
			if !ok {
				chunks = nil
				continue
			}
			err = s.sendLive(ev, &pos, live, res, ch)
			if ch.Stream != call.StreamPull && !live[ch.Stream] {
				stopLive() // the rest comes from the store: stop reading (and paying for) the live stream
			}
		}
		if err != nil {
			return
		}
	}
	for drained := false; !drained; { // what arrived before the end was seen
		select {
		case ch, ok := <-chunks:
			if !ok {
				drained = true
			} else if s.sendLive(ev, &pos, live, res, ch) != nil {
				return
			}
		default:
			drained = true
		}
	}
	cancel()                                                  // stop following: the rest comes from the store
	if _, err := restart(ev, &pos, res.Attempt); err != nil { // the stored output is the last attempt's
		return
	}
	final := r.Context()
	for _, name := range []string{call.StreamStdout, call.StreamStderr} {
		if err := s.catchUp(final, ev, &pos, res, name); err != nil {
			return
		}
	}
	full, err := s.present(final, res)
	if err != nil {
		s.log.ErrorContext(final, "read stored output", "call_id", id, "error", err)
		_ = ev.send(pos.String(), "error", call.ErrorInfo{Type: call.ErrInternal, Message: "toolpool could not read the call's stored output; GET /v1/calls/" + id})
		return
	}
	_ = ev.send(pos.String(), "result", full)
}

// sendLive sends live chunk ch of running call res: a report of its image's pull, or output. A chunk of
// an attempt earlier than this reader's is dropped (a lost worker's, landed late); the first of a later
// attempt restarts the reader's streams from byte 0 and live again.
func (s *api) sendLive(ev *sse, pos *position, live map[string]bool, res *call.Result, ch queue.Chunk) error {
	if ch.Attempt != 0 && ch.Attempt < pos.attempt {
		return nil
	}
	told, err := restart(ev, pos, ch.Attempt)
	if err != nil {
		return err
	}
	if told {
		live[call.StreamStdout], live[call.StreamStderr] = true, true
	}
	if ch.Stream == call.StreamPull {
		return sendPull(ev, *pos, res, ch)
	}
	return s.sendChunk(ev, pos, live, ch)
}

// sendChunk sends what of ch this follower does not have yet, or says exactly which bytes the live
// stream does not have; the caller then stops following live, and the rest of both streams comes from
// the store when the call ends.
func (s *api) sendChunk(ev *sse, pos *position, live map[string]bool, ch queue.Chunk) error {
	at := pos.at(ch.Stream)
	switch {
	case !live[ch.Stream] || ch.End() <= *at:
		return nil
	case ch.Offset > *at:
		live[ch.Stream] = false
		return ev.send(pos.String(), "lag", lagEvent{Stream: ch.Stream, Offset: *at, Missing: ch.Offset - *at,
			Message: fmt.Sprintf("%s bytes %d to %d are not in the live stream (printed faster than they could be published, or more than it keeps); the output from here (stdout from byte %d, stderr from byte %d) follows from the stored output when the call ends",
				ch.Stream, *at, ch.Offset, pos.out, pos.err)})
	}
	data := ch.Data[*at-ch.Offset:]
	off := *at
	*at = ch.End()
	return ev.send(pos.String(), ch.Stream, newOutputEvent(off, data))
}

// sendPull sends a status event for each report of the pull of running call res's image in ch (one JSON
// call.PullProgress a line); a line that does not decode is skipped.
func sendPull(ev *sse, pos position, res *call.Result, ch queue.Chunk) error {
	for line := range strings.Lines(string(ch.Data)) {
		var p call.PullProgress
		if json.Unmarshal([]byte(line), &p) != nil {
			continue
		}
		if err := ev.send(pos.String(), "status", statusEvent{ID: res.ID, Status: res.Status, Worker: res.Worker, Pull: &p}); err != nil {
			return err
		}
	}
	return nil
}

// catchUp sends the stored stream from where this follower is to the end of what was kept.
func (s *api) catchUp(ctx context.Context, ev *sse, pos *position, res *call.Result, name string) error {
	st := res.Streams[name]
	at := pos.at(name)
	if st == nil || st.Object == "" || *at >= st.Kept || s.outputs == nil {
		return nil
	}
	rd := s.openStream(ctx, st, *at)
	defer rd.Close()
	buf := make([]byte, eventPiece)
	for *at < st.Kept {
		n, err := io.ReadFull(rd, buf)
		if n > 0 {
			off := *at
			*at += int64(n)
			if serr := ev.send(pos.String(), name, newOutputEvent(off, buf[:n])); serr != nil {
				return serr
			}
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil
		case err != nil:
			s.log.ErrorContext(ctx, "read stored output", "call_id", res.ID, "error", err)
			return ev.send(pos.String(), "error", call.ErrorInfo{Type: call.ErrInternal,
				Message: fmt.Sprintf("toolpool could not read the stored %s from byte %d; read it with GET /v1/calls/%s/%s?offset=%d", name, *at, res.ID, name, *at)})
		}
	}
	return nil
}

// watch sends the call's record each time its status changes, until it is final or ctx ends; then the
// channel is closed.
func (s *api) watch(ctx context.Context, id string, from call.Status) <-chan *call.Result {
	out := make(chan *call.Result, 1)
	go func() {
		defer close(out)
		cur := from
		for !cur.Terminal() {
			res, err := s.store.Wait(ctx, id, func(r *call.Result) bool { return r.Status != cur })
			if err != nil || res == nil {
				if ctx.Err() != nil {
					return
				}
				select { // the store hiccuped: look again shortly
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			if res.Status == cur {
				continue
			}
			cur = res.Status
			select {
			case out <- res:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// getStream answers GET /v1/calls/{id}/stdout and /stderr: the raw bytes of the call's full stream from
// offset on, at most limit of them.
func (s *api) getStream(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	id, name := r.PathValue("id"), r.PathValue("stream")
	q := r.URL.Query()
	offset, err := queryInt(q.Get("offset"), 0)
	if err != nil {
		writeErr(w, invalid("offset=%q is not a byte offset: use a whole number from 0", q.Get("offset")))
		return
	}
	limit, err := queryInt(q.Get("limit"), rangeDefault)
	if err != nil || limit < 1 || limit > rangeMax {
		writeErr(w, invalid("limit=%q must be a whole number from 1 to %d (default %d)", q.Get("limit"), rangeMax, rangeDefault))
		return
	}
	data, st, rerr := s.readStream(r.Context(), p.tenant, id, name, offset, limit)
	if rerr != nil {
		writeErr(w, rerr)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Toolpool-Stream-Bytes", strconv.FormatInt(st.Bytes, 10))
	h.Set("X-Toolpool-Stream-Kept", strconv.FormatInt(st.Kept, 10))
	h.Set("X-Toolpool-Next-Offset", strconv.FormatInt(offset+int64(len(data)), 10))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}

func queryInt(v string, def int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil && n < 0 {
		err = errors.New("negative")
	}
	return n, err
}
