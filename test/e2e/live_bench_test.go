package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// floodPerOp is the bytes BenchmarkLiveFlood prints per b.N: `make bench` (100x) floods 200 MB.
const floodPerOp = 2_000_000

// BenchmarkLiveFlood prints b.N x 2 MB on stdout (200 MB under `make bench`) twice: once with no reader,
// then with ten readers of GET /v1/calls/{id}/events joining at different times (reader i at i tenths of
// the first run's duration). It reports the call's run time alone and with the readers (the readers must
// not slow it), the growth of the dispatcher's, the worker's and the NATS server's memory (RSS, sampled
// every 100 ms) over their level before the second flood, the live stream's peak size while the call
// runs and its size after (the retention cost of one call), when the readers were done, and their lag
// events (output the worker printed faster than it could publish is not in the live stream: those
// readers get the rest from the store). Every reader must get a contiguous stdout from byte 0 (no gap,
// no duplicate) and at least all that was kept. NATS runs apart, so that each process's memory is its
// own.
func BenchmarkLiveFlood(b *testing.B) {
	size := int64(b.N) * floodPerOp
	port, monitor := freePort(b), freePort(b)
	nats := startNATSServer(b, b.TempDir(), port, "-m", fmt.Sprint(monitor))
	s := startStackWith(b, stackOptions{policy: permissivePolicy, natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)})
	s.shell(b, "alpha-token", "flood", "true", nil) // the workspace, the binaries paged in
	command := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size)
	flood := func() string {
		r := s.shell(b, "alpha-token", "flood", command, map[string]any{"wait": false, "timeout_ms": 1200000})
		return r.result(b).ID
	}
	wait := func(id string) *call.Result {
		for {
			r := s.do(b, http.MethodGet, "/v1/calls/"+id+"?wait=30s", "alpha-token", nil).result(b)
			if r.Status.Terminal() {
				return r
			}
		}
	}
	b.ResetTimer()
	alone := wait(flood())
	aloneRun := time.Duration(alone.Timing.RunMS) * time.Millisecond

	dpid, wpid, npid := s.dispatcher.Pid(), s.worker.Pid(), nats.Pid()
	baseD, baseW, baseN := rssBytes(dpid), rssBytes(wpid), rssBytes(npid)
	stopSampling := samplePeaks(func() int64 { return rssBytes(dpid) }, func() int64 { return rssBytes(wpid) },
		func() int64 { return rssBytes(npid) }, func() int64 { return liveStreamBytes(monitor) })
	began := time.Now()
	id := flood()
	readers := make([]floodReader, 10)
	var wg sync.WaitGroup
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * aloneRun / 10) // the scenario: readers join at different times
			rd := &readers[i]
			events(b, s.request(b, http.MethodGet, "/v1/calls/"+id+"/events", "alpha-token", nil), func(ev sseEvent) bool {
				switch ev.name {
				case "stdout":
					off, data := outputBytes(b, ev)
					if off != int64(rd.got) && rd.gap == "" {
						rd.gap = fmt.Sprintf("stdout at %d after %d bytes", off, rd.got)
					}
					rd.got += len(data)
				case "lag":
					rd.lags++
				}
				return ev.name != "result"
			})
			rd.done = time.Since(began)
		}()
	}
	withReaders := wait(id)
	wg.Wait()
	peaks := stopSampling()
	peakD, peakW, peakN, peakLive := peaks[0], peaks[1], peaks[2], peaks[3]
	b.StopTimer()
	after := liveStreamBytes(monitor)

	kept := withReaders.Streams["stdout"].Kept
	var last time.Duration
	got := make([]int, len(readers))
	lags := 0
	for i, rd := range readers {
		got[i] = rd.got
		lags += rd.lags
		if rd.gap != "" || int64(rd.got) < kept {
			b.Errorf("reader %d: %d bytes, gap %q; want at least the %d kept, contiguous", i, rd.got, rd.gap, kept)
		}
		last = max(last, rd.done)
	}
	if alone.Status != call.StatusOK || withReaders.Status != call.StatusOK {
		b.Fatalf("the floods ended %s and %s", alone.Status, withReaders.Status)
	}
	run := time.Duration(withReaders.Timing.RunMS) * time.Millisecond
	b.Logf("%d MB: run alone %s, with ten readers %s; readers done %s after the start, each read %v bytes (%d lag events in all); live stream peak %d MiB, after the call %d bytes; RSS before → peak: dispatcher %d → %d MiB, worker %d → %d MiB, nats-server %d → %d MiB",
		size/1e6, aloneRun, run, last.Round(time.Millisecond), got, lags, peakLive>>20, after,
		baseD>>20, peakD>>20, baseW>>20, peakW>>20, baseN>>20, peakN>>20)
	b.ReportMetric(float64(aloneRun.Milliseconds()), "run-alone-ms")
	b.ReportMetric(float64(run.Milliseconds()), "run-with-readers-ms")
	b.ReportMetric(float64(last.Milliseconds()), "readers-done-ms")
	b.ReportMetric(float64(lags), "lag-events")
	b.ReportMetric(float64(peakD-baseD)/(1<<20), "dispatcher-rss-growth-MiB")
	b.ReportMetric(float64(peakW-baseW)/(1<<20), "worker-rss-growth-MiB")
	b.ReportMetric(float64(peakN-baseN)/(1<<20), "nats-rss-growth-MiB")
	b.ReportMetric(float64(peakLive)/float64(size), "live-stream-bytes/printed-byte")
	b.ReportMetric(float64(after), "live-stream-bytes-after")
}

// samplePeaks samples each of fns every 100 ms until the function it returns is called, which returns the
// highest value each one gave.
func samplePeaks(fns ...func() int64) func() []int64 {
	peaks := make([]int64, len(fns))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			for i, fn := range fns {
				peaks[i] = max(peaks[i], fn())
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() []int64 {
		close(stop)
		<-done
		return peaks
	}
}

// floodReader is what one reader of BenchmarkLiveFlood got.
type floodReader struct {
	got, lags int
	gap       string // the first gap or duplicate seen, if any
	done      time.Duration
}

// liveStreamBytes is the size of the live stream (TOOLPOOL_CALLS_LIVE), from the NATS server's
// monitoring port; -1 when it cannot be read.
func liveStreamBytes(monitor int) int64 {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz?streams=true", monitor))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name  string `json:"name"`
				State struct {
					Bytes int64 `json:"bytes"`
				} `json:"state"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return -1
	}
	for _, a := range jsz.Accounts {
		for _, st := range a.Streams {
			if st.Name == "TOOLPOOL_CALLS_LIVE" {
				return st.State.Bytes
			}
		}
	}
	return -1
}
