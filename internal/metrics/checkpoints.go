package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/checkpoint"
)

// Checkpointer is what the worker asks of the checkpoints that keep workspaces in object storage
// (worker.Checkpoints, implemented by checkpoint.Checkpointer).
type Checkpointer interface {
	Restore(ctx context.Context, tenant, name string) (checkpoint.Result, error)
	Save(ctx context.Context, tenant, name string) (checkpoint.Result, error)
	Unsaved() []checkpoint.Workspace
	// The operations on heads pass through uncounted: they move no data.
	Snapshot(ctx context.Context, tenant, name, snap string) (checkpoint.Head, error)
	Fork(ctx context.Context, tenant, name, snap, to string, admit func(checkpoint.Head) error) (checkpoint.Head, error)
	RestoreSnapshot(ctx context.Context, tenant, name, snap string, admit func(checkpoint.Head) error) (checkpoint.Head, error)
	SnapshotsOf(ctx context.Context, tenant, name string) ([]checkpoint.Named, error)
	List(ctx context.Context, tenant string) ([]checkpoint.Listed, error)
}

// checkpointMetrics are a worker's metrics of workspace checkpoints (docs/workspaces.md).
type checkpointMetrics struct {
	ops     *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	bytes   *prometheus.CounterVec
	files   *prometheus.CounterVec
	rehomes prometheus.Counter
	// unsaved reads the age of the oldest change no checkpoint holds (WatchUnsaved); nil: zero.
	unsaved atomic.Pointer[func() time.Duration]
}

func newCheckpointMetrics(reg prometheus.Registerer) *checkpointMetrics {
	m := &checkpointMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_ops_total",
			Help: "Checkpoint saves (after a call that may write) and restores (before every call into a workspace), by op and result: changed (a checkpoint was written, or the copy brought to a newer one), unchanged, or failed (checkpoint_failed)."},
			[]string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "checkpoint_seconds",
			Help: "Time of one save or restore, unchanged ones included (a save walks the tree; a restore reads the head).", Buckets: stepBuckets},
			[]string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_bytes_total",
			Help: "Chunk bytes moved to object storage (save) or from it (restore)."}, []string{"op"}),
		files: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_files_total",
			Help: "Files read and stored (save) or fetched and written (restore)."}, []string{"op"}),
		rehomes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "workspace_rehomes_total",
			Help: "Restores that brought this worker's copy of a workspace to a checkpoint another worker wrote: the workspace moved here."}),
	}
	for _, op := range []string{"save", "restore"} {
		for _, r := range []string{"changed", "unchanged", "failed"} {
			m.ops.WithLabelValues(op, r)
		}
		m.bytes.WithLabelValues(op)
		m.files.WithLabelValues(op)
		m.seconds.WithLabelValues(op)
	}
	unsaved := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "checkpoint_unsaved_age_seconds",
		Help: "Age of the oldest workspace change on this worker that no checkpoint holds (a save failed; the worker retries it), 0 when none."},
		func() float64 {
			if f := m.unsaved.Load(); f != nil {
				return (*f)().Seconds()
			}
			return 0
		})
	reg.MustRegister(m.ops, m.seconds, m.bytes, m.files, m.rehomes, unsaved)
	return m
}

// WatchUnsaved makes each scrape report toolpool_checkpoint_unsaved_age_seconds from age (the
// checkpointer's OldestUnsaved).
func (m *WorkerMetrics) WatchUnsaved(age func() time.Duration) { m.checkpoints.unsaved.Store(&age) }

// ObserveCheckpoints counts next's saves and restores in m.
func ObserveCheckpoints(next Checkpointer, m *WorkerMetrics) Checkpointer {
	return &observedCheckpoints{Checkpointer: next, next: next, m: m.checkpoints}
}

// observedCheckpoints counts Restore and Save; the other methods are next's (embedded).
type observedCheckpoints struct {
	Checkpointer
	next Checkpointer
	m    *checkpointMetrics
}

func (o *observedCheckpoints) Restore(ctx context.Context, tenant, name string) (checkpoint.Result, error) {
	start := time.Now()
	r, err := o.next.Restore(ctx, tenant, name)
	o.m.observe("restore", start, r, err)
	if err == nil && r.Moved {
		o.m.rehomes.Inc()
	}
	return r, err
}

func (o *observedCheckpoints) Save(ctx context.Context, tenant, name string) (checkpoint.Result, error) {
	start := time.Now()
	r, err := o.next.Save(ctx, tenant, name)
	o.m.observe("save", start, r, err)
	return r, err
}

func (m *checkpointMetrics) observe(op string, start time.Time, r checkpoint.Result, err error) {
	m.seconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	m.bytes.WithLabelValues(op).Add(float64(r.Bytes))
	m.files.WithLabelValues(op).Add(float64(r.Files))
	switch {
	case err != nil:
		m.ops.WithLabelValues(op, "failed").Inc()
	case r.Changed:
		m.ops.WithLabelValues(op, "changed").Inc()
	default:
		m.ops.WithLabelValues(op, "unchanged").Inc()
	}
}
