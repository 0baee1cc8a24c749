package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// rssBytes is a process's resident memory.
func rssBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestOutputMeasure measures what the output issue asks to show; opt-in (TOOLPOOL_MEASURE_OUTPUT=1),
// since it floods 200 MB and its numbers depend on the host: the latency from a print in the container to
// an event read by a client, the memory of the dispatcher, the worker and the NATS server while
// ten followers read a 200 MB flood, range reads of the kept output, and a go-test-like command followed
// with the CLI.
func TestOutputMeasure(t *testing.T) {
	if os.Getenv("TOOLPOOL_MEASURE_OUTPUT") == "" {
		t.Skip("set TOOLPOOL_MEASURE_OUTPUT=1 to measure output latency and memory under a flood")
	}
	// An external NATS server, so that the dispatcher's memory is its own.
	port := freePort(t)
	nats := startNATSServer(t, t.TempDir(), port)
	s := startStackWith(t, stackOptions{policy: permissivePolicy, natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)})

	// Latency: each line is the container's clock in nanoseconds when it was printed (same host clock).
	var lat []float64 // milliseconds
	body := map[string]any{"tool": "run_shell", "workspace": "m", "args": map[string]any{
		"command": "for i in $(seq 200); do date +%s%N; sleep 0.05; done"}}
	events(t, s.request(t, http.MethodPost, "/v1/calls", "alpha-token", body), func(ev sseEvent) bool {
		if ev.name == "stdout" {
			_, b := outputBytes(t, ev)
			for _, line := range strings.Fields(string(b)) {
				if ns, err := strconv.ParseInt(line, 10, 64); err == nil {
					lat = append(lat, float64(ev.at.Sub(time.Unix(0, ns)).Microseconds())/1000)
				}
			}
		}
		return ev.name != "result"
	})
	if len(lat) < 150 {
		t.Fatalf("only %d timestamped lines arrived live", len(lat))
	}
	t.Logf("print-to-client latency over %d lines: p50 %.1f ms, p95 %.1f ms, max %.1f ms (load average %s)", len(lat),
		percentile(lat, 50), percentile(lat, 95), percentile(lat, 100), loadavg())

	// Flood: 200 MB on stdout, ten followers from the start, memory sampled throughout.
	dpid, wpid, npid := s.dispatcher.Pid(), s.worker.Pid(), nats.Pid()
	baseD, baseW, baseN := rssBytes(dpid), rssBytes(wpid), rssBytes(npid)
	r := s.shell(t, "alpha-token", "m", "head -c 200000000 /dev/zero | tr '\\0' x", map[string]any{"wait": false, "timeout_ms": 600000})
	id := r.result(t).ID
	stopSampling := samplePeaks(func() int64 { return rssBytes(dpid) }, func() int64 { return rssBytes(wpid) },
		func() int64 { return rssBytes(npid) })
	began := time.Now()
	var wg sync.WaitGroup
	got := make([]int64, 10)
	lags := make([]int, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			events(t, s.request(t, http.MethodGet, "/v1/calls/"+id+"/events", "alpha-token", nil), func(ev sseEvent) bool {
				switch ev.name {
				case "stdout":
					_, b := outputBytes(t, ev)
					got[i] += int64(len(b))
				case "lag":
					lags[i]++
				}
				return ev.name != "result"
			})
		}()
	}
	wg.Wait()
	peaks := stopSampling()
	final := s.do(t, http.MethodGet, "/v1/calls/"+id, "alpha-token", nil).result(t)
	t.Logf("flood: %s in %s, streams %+v; ten followers done %s after the start, each read %v bytes (lag events %v)",
		final.Status, time.Duration(final.Timing.RunMS)*time.Millisecond, *final.Streams["stdout"], time.Since(began).Round(time.Millisecond), got, lags)
	t.Logf("memory (RSS): dispatcher %d MiB before, %d MiB peak; worker %d MiB before, %d MiB peak; nats-server %d MiB before, %d MiB peak",
		baseD>>20, peaks[0]>>20, baseW>>20, peaks[1]>>20, baseN>>20, peaks[2]>>20)
	if final.Status != call.StatusOK {
		t.Errorf("flood ended %s", final.Status)
	}

	// Range reads of the kept 64 MiB.
	for _, off := range []int64{0, 32 << 20, 63 << 20} {
		t0 := time.Now()
		rr := s.do(t, http.MethodGet, fmt.Sprintf("/v1/calls/%s/stdout?offset=%d&limit=%d", id, off, 1<<20), "alpha-token", nil)
		t.Logf("range read of 1 MiB at offset %d MiB: HTTP %d, %d bytes in %s", off>>20, rr.code, len(rr.body), time.Since(t0).Round(time.Millisecond))
	}
	t0 := time.Now()
	cli := exec.Command(filepath.Join(binaries(t), "toolpool"), "output", id)
	cli.Env = append(os.Environ(), "TOOLPOOL_URL="+s.url, "TOOLPOOL_TOKEN=alpha-token")
	out, err := cli.Output()
	t.Logf("toolpool output of the whole kept stdout: %d bytes in %s (err %v)", len(out), time.Since(t0).Round(time.Millisecond), err)

	// A go-test-like command followed with the CLI: each line is stamped when the CLI printed it.
	cli = exec.Command(filepath.Join(binaries(t), "toolpool"), "call", "run_shell", "--workspace", "m", "--follow",
		`command=for p in Parse Plan Run; do echo "=== RUN   Test$p"; sleep 1; echo "--- PASS: Test$p (1.00s)"; done; echo PASS; echo "ok  	example.com/pkg	3.012s"`)
	cli.Env = append(os.Environ(), "TOOLPOOL_URL="+s.url, "TOOLPOOL_TOKEN=alpha-token")
	pipe, _ := cli.StdoutPipe()
	var stderr strings.Builder
	cli.Stderr = &stderr
	t0 = time.Now()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	var transcript strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		fmt.Fprintf(&transcript, "  +%5.2fs  %s\n", time.Since(t0).Seconds(), sc.Text())
	}
	_ = cli.Wait()
	t.Logf("toolpool call run_shell --follow (time each line reached the terminal):\n%s  %s", transcript.String(), stderr.String())
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
