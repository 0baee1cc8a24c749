package dispatcher

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/workspace"
)

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		header      string
		off, length int64
		ok          bool
	}{
		{"bytes=0-9", 0, 10, true},
		{"bytes=7-20", 7, 14, true},
		{"bytes=5-", 5, -1, true},
		{"bytes=-5", -5, -1, true},
		{"bytes=9-3", 0, 0, false},
		{"bytes=-0", 0, 0, false},
		{"bytes=0-1,4-5", 0, 0, false},
		{"items=0-1", 0, 0, false},
		{"bytes=a-b", 0, 0, false},
		{"bytes=-", 0, 0, false},
		{"bytes=-1-2", 0, 0, false},
	} {
		off, length, ok := parseRange(tc.header)
		if ok != tc.ok || (ok && (off != tc.off || length != tc.length)) {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d, %v", tc.header, off, length, ok, tc.off, tc.length, tc.ok)
		}
	}
}

// memTransfers is a transfer store in memory.
type memTransfers struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func (m *memTransfers) PutOutput(_ context.Context, name string, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objs[name] = b
	return int64(len(b)), nil
}

func (m *memTransfers) OpenOutput(_ context.Context, name string, offset int64) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[name]
	if !ok {
		return nil, queue.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(b[min(offset, int64(len(b))):])), nil
}

func (m *memTransfers) DeleteOutput(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, name)
	return nil
}

func (m *memTransfers) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.objs)
}

// TestUploadKeptWhileItsOperationMayRun: an upload is deleted when its operation is over without running
// (refused by policy), and kept when the operation is queued but its record could not be written, or may
// have been queued (the publish's acknowledgement lost): its worker consumes and deletes it. Deleting it
// then made an accepted upload fail on the worker with its archive gone.
func TestUploadKeptWhileItsOperationMayRun(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fault    func(h *harness)
		wantCode int
		wantKept bool
	}{
		{"refused by policy", func(h *harness) {
			h.pol.decisions[workspace.OpUpload] = policy.Decision{Action: policy.Deny, Rule: "no-uploads", Reason: "denied by rule no-uploads"}
		}, http.StatusForbidden, false},
		{"queued, its record not written", func(h *harness) { h.store.FailWith(failOn(queuetest.OpCreate, "", errBoom)) }, http.StatusAccepted, true},
		{"publish unanswered", func(h *harness) { h.pub.err = errBoom }, http.StatusServiceUnavailable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			transfers := &memTransfers{objs: map[string][]byte{}}
			h := newHarness(t, setup{transfers: transfers})
			tc.fault(h)
			r := h.do(http.MethodPut, "/v1/workspaces/ws/files/notes.txt", acmeCaller, "hello")
			if r.code != tc.wantCode {
				t.Fatalf("upload answered %d %s, want %d", r.code, r.body, tc.wantCode)
			}
			if kept := transfers.count() == 1; kept != tc.wantKept {
				t.Fatalf("upload kept in the transfer store: %v, want %v (answer %d %s)", kept, tc.wantKept, r.code, r.body)
			}
		})
	}
}
