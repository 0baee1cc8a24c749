package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
)

// This file reads what a call printed: a finished call's full stdout and stderr by range, from the pieces
// its worker stored (readStream, streamReader), and the read_output tool's answer (readOutput). The HTTP
// handlers that serve them, and the live event stream, are in http_stream.go.

// Live delivers the output of running calls as workers publish it.
type Live interface { // the following half of queue.Live
	// FollowOutput delivers call id's chunks from the first byte retained, what is retained first and
	// then live, until ctx ends (then the channel is closed); a chunk past where the previous one ended
	// means the bytes in between are not retained, and a chunk of a later attempt starts the streams
	// over. A receiver more than buffer chunks behind holds delivery up, not the call.
	FollowOutput(ctx context.Context, id string, buffer int) (<-chan queue.Chunk, error)
}

// WithLive lets GET /v1/calls/{id}/events (and POST /v1/calls with Accept: text/event-stream) stream
// output as it is printed; without it they stream status changes, and the output once the call ends.
func WithLive(l Live) Option { return func(s *Server) { s.live = l } }

// readStream reads up to limit bytes of the full stream name of tenant's finished call id from offset on.
func (s *Server) readStream(ctx context.Context, tenant, id, name string, offset, limit int64) ([]byte, call.Stream, error) {
	var none call.Stream
	if name != call.StreamStdout && name != call.StreamStderr {
		return nil, none, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: fmt.Sprintf("no stream %q: read stdout or stderr", name)}
	}
	rec, err := s.lookup(ctx, tenant, id)
	if err != nil {
		return nil, none, err
	}
	res := rec.Result
	if !res.Status.Terminal() {
		return nil, none, &call.Rejection{Kind: call.KindConflict, Type: call.ErrNotFinished, Message: fmt.Sprintf(
			"call %s is %s: its full output can be read by range once it ends; follow it live with GET /v1/calls/%s/events", id, res.Status, id)}
	}
	if tool, ok := s.tools.Lookup(res.Tool); ok && !tool.Streams() {
		return nil, none, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: fmt.Sprintf(
			"call %s ran %s, whose whole output is the envelope's output field: GET /v1/calls/%s", id, res.Tool, id)}
	}
	st := res.Streams[name]
	if st == nil {
		return nil, call.Stream{}, nil // nothing printed on it
	}
	switch {
	case offset > st.Kept:
		return nil, none, &call.Rejection{Kind: call.KindRangeNotSatisfiable, Type: call.ErrInvalidRange, Message: fmt.Sprintf(
			"offset %d is past the end of the kept %s (%d bytes kept of %d printed): read from an offset below %d", offset, name, st.Kept, st.Bytes, st.Kept)}
	case offset == st.Kept:
		return nil, *st, nil
	case s.outputs == nil:
		return nil, none, &call.Rejection{Kind: call.KindUnavailable, Type: call.ErrInternal, Message: "this dispatcher has no output store"}
	}
	rd := s.openStream(ctx, st, offset)
	defer rd.Close()
	b, err := io.ReadAll(io.LimitReader(rd, limit))
	if err != nil {
		s.log.ErrorContext(ctx, "read stored output", "call_id", id, "error", err)
		return nil, none, &call.Rejection{Kind: call.KindUnavailable, Type: call.ErrInternal, RetryAfter: time.Second, Message: "toolpool could not read the stored output; retry"}
	}
	return b, *st, nil
}

// readOutput answers a read_output call at once, from the output store: it is never queued nor recorded.
func (s *Server) readOutput(ctx context.Context, c *call.Call) (*call.Result, error) {
	a, err := tools.ParseReadOutput(c.Args)
	if err != nil {
		return nil, &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams, Message: err.Error()}
	}
	limit := c.Limits.OutputBytes
	if a.Limit > 0 {
		limit = min(limit, a.Limit)
	}
	res := call.NewResult(c, call.StatusOK)
	res.FinishedAt = s.now().UTC()
	b, st, err := s.readStream(ctx, c.Tenant, a.CallID, a.Stream, a.Offset, limit)
	if err != nil {
		// The request's problem is the call's error; toolpool's failure is the request's.
		var rej *call.Rejection
		if !errors.As(err, &rej) || rej.Kind == call.KindUnavailable {
			return nil, err
		}
		res.Fail(call.StatusError, rej.Type, rej.Message)
		return res, nil
	}
	next := a.Offset + int64(len(b))
	var tail string
	switch {
	case next < st.Kept:
		tail = fmt.Sprintf("\n[bytes %d to %d of %d of %s; read on with %s]", a.Offset, next, st.Kept, a.Stream,
			tools.ReadHint(a.CallID, a.Stream, next, limit))
	default:
		tail = fmt.Sprintf("\n[bytes %d to %d of %s: the end", a.Offset, next, a.Stream)
		if st.Kept < st.Bytes {
			tail += fmt.Sprintf(" of what was kept (the first %d of the %d bytes printed)", st.Kept, st.Bytes)
		}
		tail += "]"
	}
	res.Output = strings.ToValidUTF8(string(b), "\uFFFD") + tail
	res.OutputBytes = int64(len(b))
	res.Truncated = next < st.Kept
	return res, nil
}

// pageWait bounds reading one stored piece of a stream.
const pageWait = time.Minute

// streamReader reads a stored stream from an offset on, opening its pieces one after the other: a read
// at any offset starts at its piece, and nothing is held whole. It never reads past what was kept.
type streamReader struct {
	ctx    context.Context
	outs   Outputs
	st     *call.Stream
	off    int64
	cur    io.ReadCloser
	cancel context.CancelFunc
}

func (s *Server) openStream(ctx context.Context, st *call.Stream, offset int64) *streamReader {
	return &streamReader{ctx: ctx, outs: s.outputs, st: st, off: offset}
}

func (r *streamReader) Read(p []byte) (int, error) {
	for {
		if r.off >= r.st.Kept {
			return 0, io.EOF
		}
		if r.cur == nil {
			page := max(r.st.Page, 1)
			ctx, cancel := context.WithTimeout(r.ctx, pageWait)
			cur, err := r.outs.OpenOutput(ctx, r.st.PageName(r.off/page), r.off%page)
			if err != nil {
				cancel()
				return 0, err
			}
			r.cur, r.cancel = cur, cancel
		}
		n, err := r.cur.Read(p[:min(int64(len(p)), r.st.Kept-r.off)])
		r.off += int64(n)
		if errors.Is(err, io.EOF) {
			r.closePage()
			err = nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

func (r *streamReader) closePage() {
	if r.cur != nil {
		_ = r.cur.Close()
		r.cancel()
		r.cur = nil
	}
}

// Close releases the piece being read.
func (r *streamReader) Close() error {
	r.closePage()
	return nil
}
