package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/checkpoint"
)

// checkpointMetrics are a worker's metrics of workspace checkpoints (docs/workspaces.md).
type checkpointMetrics struct {
	ops     *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	bytes   *prometheus.CounterVec
	files   *prometheus.CounterVec
	rehomes prometheus.Counter
	// gc counts the garbage collections of tenants' checkpoints (checkpoint.Collected).
	gcRuns    *prometheus.CounterVec
	gcObjects prometheus.Counter
	gcBytes   prometheus.Counter
	gcSeconds prometheus.Histogram
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
	m.gcRuns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_gc_runs_total",
		Help: "Garbage collections of a tenant's checkpoint objects this worker ran, by result: ok or failed (nothing is deleted when the mark fails)."},
		[]string{"result"})
	m.gcObjects = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_gc_swept_objects_total",
		Help: "Chunks and trees that garbage collection deleted: no head named them and they were older than the grace."})
	m.gcBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_gc_swept_bytes_total",
		Help: "Bytes of the chunks and trees that garbage collection deleted."})
	m.gcSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "checkpoint_gc_seconds",
		Help: "Time of one tenant's garbage collection: the mark (reading every tree its heads name) and the sweep.", Buckets: stepBuckets})
	m.gcRuns.WithLabelValues("ok")
	m.gcRuns.WithLabelValues("failed")
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
	reg.MustRegister(m.ops, m.seconds, m.bytes, m.files, m.rehomes, unsaved, m.gcRuns, m.gcObjects, m.gcBytes, m.gcSeconds)
	return m
}

// WatchUnsaved makes each scrape report toolpool_checkpoint_unsaved_age_seconds from age (the
// checkpointer's OldestUnsaved).
func (m *WorkerMetrics) WatchUnsaved(age func() time.Duration) { m.checkpoints.unsaved.Store(&age) }

// ObserveCheckpoint counts one checkpoint save or restore (op "save" or "restore") that took took: it is
// checkpoint.Config's Observe. The operations on heads (snapshot, fork, restore of a snapshot) are not
// counted: they move no data.
func (m *WorkerMetrics) ObserveCheckpoint(op string, r checkpoint.Result, took time.Duration, err error) {
	m.checkpoints.observe(op, r, took, err)
}

func (m *checkpointMetrics) observe(op string, r checkpoint.Result, took time.Duration, err error) {
	if op == "restore" && err == nil && r.Moved {
		m.rehomes.Inc()
	}
	m.seconds.WithLabelValues(op).Observe(took.Seconds())
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

// ObserveCollect counts one garbage collection of tenant's checkpoints (checkpoint's CollectAll's
// observe): what it swept, how long it took, whether it failed. The tenant is not a label.
func (m *WorkerMetrics) ObserveCollect(tenant string, r checkpoint.Collected, err error) {
	c := m.checkpoints
	c.gcSeconds.Observe(r.Took.Seconds())
	c.gcObjects.Add(float64(r.Swept))
	c.gcBytes.Add(float64(r.SweptBytes))
	if err != nil {
		c.gcRuns.WithLabelValues("failed").Inc()
		return
	}
	c.gcRuns.WithLabelValues("ok").Inc()
}
