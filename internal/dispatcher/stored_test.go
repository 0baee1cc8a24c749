package dispatcher

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// fakeOutputs is an output store of named objects; a missing name is queue.ErrNotFound.
type fakeOutputs map[string][]byte

func (o fakeOutputs) ReadOutput(_ context.Context, name string, offset, limit int64) ([]byte, error) {
	b, ok := o[name]
	if !ok {
		return nil, queue.ErrNotFound
	}
	b = b[min(offset, int64(len(b))):]
	if limit >= 0 {
		b = b[:min(limit, int64(len(b)))]
	}
	return b, nil
}

func (o fakeOutputs) OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error) {
	b, err := o.ReadOutput(ctx, name, offset, -1)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// TestStoredOutputsReadBack: a result whose fields a worker kept in the output store (Result.Stored) is
// answered whole, by GET and by the front ends' Wait, and never shows "stored"; a store that lost the
// object answers 503 (REST) or a retryable internal rejection (Wait), never an envelope with an empty field.
func TestStoredOutputsReadBack(t *testing.T) {
	h := newHarness(t, setup{})
	big := strings.Repeat("x", 100_000)
	outs := fakeOutputs{"obj-stdout": []byte(big)}
	h.srv.outputs = outs
	id := h.queued("acme", call.StatusOK)
	rec, err := h.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	r := rec.Result
	r.Stored = map[string]string{"stdout": "obj-stdout"}
	if _, err := h.store.Update(context.Background(), r, rec.Revision); err != nil {
		t.Fatal(err)
	}

	rep := h.do(http.MethodGet, "/v1/calls/"+id, acmeCaller, nil)
	if rep.code != http.StatusOK || bytes.Contains(rep.body, []byte(`"stored"`)) {
		t.Fatalf("GET: %d %.200s", rep.code, rep.body)
	}
	if got := rep.result(t).Stdout; got != big {
		t.Errorf("GET: stdout has %d bytes, want the %d stored", len(got), len(big))
	}
	got, err := h.srv.Wait(h.as(acmeCaller), id, func(*call.Result) bool { return true })
	if err != nil || got.Stdout != big || got.Stored != nil {
		t.Errorf("Wait: stdout %d bytes, stored %v, err %v; want the %d stored bytes", len(got.Stdout), got.Stored, err, len(big))
	}

	delete(outs, "obj-stdout")
	h.do(http.MethodGet, "/v1/calls/"+id, acmeCaller, nil).wantError(t, http.StatusServiceUnavailable, call.ErrInternal, "stored output")
	var rej *call.Rejection
	if _, err := h.srv.Wait(h.as(acmeCaller), id, func(*call.Result) bool { return true }); !errors.As(err, &rej) || rej.Type != call.ErrInternal {
		t.Errorf("Wait with the object gone: %v, want an internal rejection", err)
	}
}
