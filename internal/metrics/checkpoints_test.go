package metrics_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/metrics"
)

// TestObserveCheckpoint: each save and restore counted by result, with its bytes, files and time; a
// restore from another worker's checkpoint is a re-home.
func TestObserveCheckpoint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.DefaultOptions())
	for _, o := range []struct {
		op  string
		r   checkpoint.Result
		err error
	}{
		{"save", checkpoint.Result{Changed: true, Files: 2, Bytes: 100}, nil},
		{"save", checkpoint.Result{}, nil},
		{"save", checkpoint.Result{}, errors.New("unreachable")},
		{"restore", checkpoint.Result{Changed: true, Moved: true, Files: 3, Bytes: 7}, nil},
		{"restore", checkpoint.Result{Changed: true}, nil},
	} {
		m.ObserveCheckpoint(o.op, o.r, time.Second, o.err)
	}
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

// TestObserveCollect: each garbage collection counted by result, with what it swept and its time.
func TestObserveCollect(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.DefaultOptions())
	m.ObserveCollect("acme", checkpoint.Collected{Swept: 3, SweptBytes: 300, Took: time.Second}, nil)
	m.ObserveCollect("globex", checkpoint.Collected{Swept: 1, SweptBytes: 50, Took: 2 * time.Second}, errors.New("delete failed"))
	m.ObserveCollect("acme", checkpoint.Collected{Took: time.Second}, nil)
	mustSample(t, reg, "toolpool_checkpoint_gc_runs_total", map[string]string{"result": "ok"}, 2)
	mustSample(t, reg, "toolpool_checkpoint_gc_runs_total", map[string]string{"result": "failed"}, 1)
	mustSample(t, reg, "toolpool_checkpoint_gc_swept_objects_total", nil, 4)
	mustSample(t, reg, "toolpool_checkpoint_gc_swept_bytes_total", nil, 350)
	mustSample(t, reg, "toolpool_checkpoint_gc_seconds", nil, 3)
}
