package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// imageMetrics are a worker's metrics of the images its calls run on (docs/images.md).
type imageMetrics struct {
	pulls       *prometheus.CounterVec
	pullBytes   prometheus.Counter
	pullSeconds prometheus.Histogram
	lookups     *prometheus.CounterVec
	cacheBytes  prometheus.Gauge
}

func newImageMetrics(reg prometheus.Registerer) *imageMetrics {
	m := &imageMetrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "image_pulls_total",
			Help: "Image pulls, each counted once however many calls waited for it, by result: ok, failed (image_pull_failed) or refused (image_refused)."},
			[]string{"result"}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "image_pull_bytes_total",
			Help: "Size of the images pulled (config and layers, compressed, as their manifests give it)."}),
		pullSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "image_pull_seconds",
			Help: "Time of one pull, resolve to unpacked snapshot.", Buckets: durationBuckets}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "image_lookups_total",
			Help: "Calls on an image, by result: hit (the image was in the store) or miss (the call waited for a pull)."},
			[]string{"result"}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "image_cache_bytes",
			Help: "Content of the images the worker pulled, each layer counted once, as of the last pull."}),
	}
	for _, r := range []string{"ok", "failed", "refused"} {
		m.pulls.WithLabelValues(r)
	}
	m.lookups.WithLabelValues("hit")
	m.lookups.WithLabelValues("miss")
	reg.MustRegister(m.pulls, m.pullBytes, m.pullSeconds, m.lookups, m.cacheBytes)
	return m
}

// ObserveImagePull records one pull (pass it as the runtime's pull hook): its result, the image's size
// when it succeeded, and its time.
func (m *WorkerMetrics) ObserveImagePull(bytes int64, took time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, sandbox.ErrImageRefused):
		result = "refused"
	case err != nil:
		result = "failed"
	default:
		m.images.pullBytes.Add(float64(bytes))
	}
	m.images.pulls.WithLabelValues(result).Inc()
	m.images.pullSeconds.Observe(took.Seconds())
}

// ObserveImageLookup records a call's look-up of its image: hit when it was in the store.
func (m *WorkerMetrics) ObserveImageLookup(hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	m.images.lookups.WithLabelValues(result).Inc()
}

// SetImageCacheBytes records the pulled images' content.
func (m *WorkerMetrics) SetImageCacheBytes(bytes int64) { m.images.cacheBytes.Set(float64(bytes)) }
