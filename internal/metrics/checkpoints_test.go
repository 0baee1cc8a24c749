package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/metrics"
)

// fakeCheckpointer answers each call with the next of its results.
type fakeCheckpointer struct {
	metrics.Checkpointer // the operations on heads, which are not counted: never called
	results              []checkpoint.Result
	errs                 []error
}

func (f *fakeCheckpointer) next() (checkpoint.Result, error) {
	r, err := f.results[0], f.errs[0]
	f.results, f.errs = f.results[1:], f.errs[1:]
	return r, err
}

func (f *fakeCheckpointer) Restore(context.Context, string, string) (checkpoint.Result, error) {
	return f.next()
}
func (f *fakeCheckpointer) Save(context.Context, string, string) (checkpoint.Result, error) {
	return f.next()
}
func (f *fakeCheckpointer) Unsaved() []checkpoint.Workspace { return nil }

// TestObserveCheckpoints: each save and restore counted by result, with its bytes, files and time; a
// restore from another worker's checkpoint is a re-home.
func TestObserveCheckpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.DefaultOptions())
	f := &fakeCheckpointer{
		results: []checkpoint.Result{{Changed: true, Files: 2, Bytes: 100}, {}, {}, {Changed: true, Moved: true, Files: 3, Bytes: 7}, {Changed: true}},
		errs:    []error{nil, nil, errors.New("unreachable"), nil, nil},
	}
	cp := metrics.ObserveCheckpoints(f, m)
	ctx := context.Background()
	cp.Save(ctx, "t", "w")
	cp.Save(ctx, "t", "w")
	cp.Save(ctx, "t", "w")
	cp.Restore(ctx, "t", "w")
	cp.Restore(ctx, "t", "w")
	mustSample(t, reg, "toolpool_checkpoint_ops_total", map[string]string{"op": "save", "result": "changed"}, 1)
	mustSample(t, reg, "toolpool_checkpoint_ops_total", map[string]string{"op": "save", "result": "unchanged"}, 1)
	mustSample(t, reg, "toolpool_checkpoint_ops_total", map[string]string{"op": "save", "result": "failed"}, 1)
	mustSample(t, reg, "toolpool_checkpoint_ops_total", map[string]string{"op": "restore", "result": "changed"}, 2)
	mustSample(t, reg, "toolpool_workspace_rehomes_total", nil, 1)
	mustSample(t, reg, "toolpool_checkpoint_bytes_total", map[string]string{"op": "save"}, 100)
	mustSample(t, reg, "toolpool_checkpoint_files_total", map[string]string{"op": "restore"}, 3)
	mustSample(t, reg, "toolpool_checkpoint_seconds", map[string]string{"op": "save"}, 3)
	mustSample(t, reg, "toolpool_checkpoint_unsaved_age_seconds", nil, 0)
	m.WatchUnsaved(func() time.Duration { return 90 * time.Second })
	mustSample(t, reg, "toolpool_checkpoint_unsaved_age_seconds", nil, 90)
}
