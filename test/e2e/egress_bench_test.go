package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// BenchmarkEgressOverhead measures what egress costs a call: `true` through the whole stack, alternately
// for tenant dev (network granted: the call's proxy, the forwarder as the container's first process, the
// runner, socket and CA bundle mounts) and tenant beta (no network), and reports the p50/p95 of each
// one's total_ms and client-observed latency, and their difference.
func BenchmarkEgressOverhead(b *testing.B) {
	s := startEgressStack(b)
	type sample struct{ total, sandbox, run, client []float64 }
	var with, without sample
	call1 := func(token string, into *sample) {
		began := time.Now()
		r := s.do(b, http.MethodPost, "/v1/calls", token, map[string]any{"tool": "run_shell", "workspace": "bench", "args": map[string]any{"command": "true"}})
		elapsed := float64(time.Since(began).Microseconds()) / 1000
		res := r.result(b)
		if res.Status != call.StatusOK {
			b.Fatalf("call: %s", r.body)
		}
		into.client = append(into.client, elapsed)
		into.total = append(into.total, float64(res.Timing.TotalMS))
		into.sandbox = append(into.sandbox, float64(res.Timing.SandboxMS))
		into.run = append(into.run, float64(res.Timing.RunMS))
	}
	var warm sample
	call1("dev-token", &warm) // the first call prepares the workspace and pages in the binaries
	call1("beta-token", &warm)
	b.ResetTimer()
	for range b.N {
		call1("dev-token", &with)
		call1("beta-token", &without)
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		s    sample
	}{{"egress", with}, {"none", without}} {
		b.ReportMetric(percentile(m.s.total, 50), m.name+"-total-p50-ms")
		b.ReportMetric(percentile(m.s.total, 95), m.name+"-total-p95-ms")
		b.ReportMetric(percentile(m.s.sandbox, 50), m.name+"-sandbox-p50-ms")
		b.ReportMetric(percentile(m.s.run, 50), m.name+"-run-p50-ms")
		b.ReportMetric(percentile(m.s.run, 95), m.name+"-run-p95-ms")
		b.ReportMetric(percentile(m.s.client, 50), m.name+"-client-p50-ms")
		b.ReportMetric(percentile(m.s.client, 95), m.name+"-client-p95-ms")
	}
	b.ReportMetric(percentile(with.total, 50)-percentile(without.total, 50), "overhead-total-p50-ms")
	b.ReportMetric(percentile(with.total, 95)-percentile(without.total, 95), "overhead-total-p95-ms")
}
