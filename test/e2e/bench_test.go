package e2e

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// BenchmarkEndToEndTrue runs `true` through the whole stack, one call after another, and reports the
// p50/p95 of the envelope's total_ms and sandbox_ms (and the client-observed latency), and the p50 of its
// queued_ms and run_ms. Compare with
// BenchmarkPlainContainerd in internal/sandbox/containerd, measured in the same `make bench` run. Back to
// back, every call's replacement container is being made while the next call runs: on 2 cores that is a
// throughput measure as much as a latency one.
func BenchmarkEndToEndTrue(b *testing.B) { benchEndToEndTrue(b, 0) }

// BenchmarkEndToEndTruePaced is BenchmarkEndToEndTrue with 500 ms between calls (not timed), as an agent
// calls its tools with a model's turn in between: the latency of one call on a host that is not also
// making containers for the calls before it.
func BenchmarkEndToEndTruePaced(b *testing.B) { benchEndToEndTrue(b, 500*time.Millisecond) }

func benchEndToEndTrue(b *testing.B, gap time.Duration) {
	s := startStack(b)
	// Warm up: the first call prepares the workspace and pages in the binaries.
	s.shell(b, "dev-token", "bench", "true", nil)
	var total, sandbox, run, queued, client []float64
	warm := 0
	b.ResetTimer()
	for range b.N {
		if gap > 0 {
			b.StopTimer()
			time.Sleep(gap)
			b.StartTimer()
		}
		began := time.Now()
		r := s.do(b, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "run_shell", "workspace": "bench", "args": map[string]any{"command": "true"}})
		client = append(client, float64(time.Since(began).Microseconds())/1000)
		res := r.result(b)
		if res.Status != call.StatusOK {
			b.Fatalf("call: %s", r.body)
		}
		total = append(total, float64(res.Timing.TotalMS))
		sandbox = append(sandbox, float64(res.Timing.SandboxMS))
		run = append(run, float64(res.Timing.RunMS))
		queued = append(queued, float64(res.Timing.QueuedMS))
		if res.Timing.Warm {
			warm++
		}
	}
	b.StopTimer()
	b.ReportMetric(percentile(total, 50), "total-p50-ms")
	b.ReportMetric(percentile(total, 95), "total-p95-ms")
	b.ReportMetric(percentile(sandbox, 50), "sandbox-p50-ms")
	b.ReportMetric(percentile(sandbox, 95), "sandbox-p95-ms")
	// Where the rest of total goes: in the queue (dispatcher to worker), and the process's life.
	b.ReportMetric(percentile(queued, 50), "queued-p50-ms")
	b.ReportMetric(percentile(run, 50), "run-p50-ms")
	b.ReportMetric(percentile(client, 50), "client-p50-ms")
	b.ReportMetric(percentile(client, 95), "client-p95-ms")
	b.ReportMetric(100*float64(warm)/float64(b.N), "warm-%") // the worker's pool is on by default
}

// percentile returns the p-th percentile (nearest rank) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
