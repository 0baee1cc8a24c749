package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// benchCall is one kind of call in the mix, with its weight.
type benchCall struct {
	name   string
	weight int
	body   map[string]any
}

// benchMixes are the calls `toolpool bench --mix` can name. Each is allowed by the shipped default policy.
var benchMixes = map[string]func(ws string) map[string]any{
	"shell": func(ws string) map[string]any {
		return map[string]any{"tool": "run_shell", "workspace": ws, "args": map[string]any{"command": "echo ok"}}
	},
	"list": func(ws string) map[string]any {
		return map[string]any{"tool": "list_files", "workspace": ws, "args": map[string]any{"path": "."}}
	},
	"glob": func(ws string) map[string]any {
		return map[string]any{"tool": "glob", "workspace": ws, "args": map[string]any{"pattern": "**/*"}}
	},
	"sleep": func(ws string) map[string]any {
		return map[string]any{"tool": "run_shell", "workspace": ws, "args": map[string]any{"command": "sleep 1; echo slept"}}
	},
}

func parseMix(s, ws string) ([]benchCall, error) {
	var mix []benchCall
	for _, part := range strings.Split(s, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(part), "=")
		weight := 1
		if ok {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%w: --mix weight %q must be a positive number", errUsage, w)
			}
			weight = n
		}
		mk, known := benchMixes[name]
		if !known {
			return nil, fmt.Errorf("%w: --mix names %q; known: shell, list, glob, sleep", errUsage, name)
		}
		mix = append(mix, benchCall{name: name, weight: weight, body: mk(ws)})
	}
	return mix, nil
}

// benchResult is what one call of the benchmark saw.
type benchResult struct {
	id      string
	kind    string
	status  call.Status
	latency time.Duration
	err     error
}

func cmdBench(c *client, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	concurrency := fs.Int("concurrency", 4, "calls in flight at once")
	rate := fs.Float64("rate", 0, "calls per second to start (0: as fast as the concurrency allows)")
	duration := fs.Duration("duration", 30*time.Second, "how long to start calls")
	requests := fs.Int("requests", 0, "stop after this many calls (0: run for --duration)")
	mixFlag := fs.String("mix", "shell", "the calls to make, with weights: shell=8,list=1,glob=1,sleep=1")
	ws := fs.String("workspace", "bench", "workspace name")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *concurrency < 1 || *concurrency > 4096 {
		return fmt.Errorf("%w: --concurrency %d must be 1..4096", errUsage, *concurrency)
	}
	mix, err := parseMix(*mixFlag, *ws)
	if err != nil {
		return err
	}
	var weighted []benchCall
	for _, m := range mix {
		for range m.weight {
			weighted = append(weighted, m)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var tick <-chan time.Time
	if *rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / *rate))
		defer t.Stop()
		tick = t.C
	}
	jobs := make(chan benchCall)
	results := make(chan benchResult, 1024)
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for job := range jobs {
				results <- runBenchCall(c, job)
			}
		}()
	}
	started := time.Now()
	go func() {
		defer close(jobs)
		for n := 0; *requests == 0 || n < *requests; n++ {
			if tick != nil {
				select {
				case <-ctx.Done():
					return
				case <-tick:
				}
			}
			select {
			case <-ctx.Done():
				return
			case jobs <- weighted[rand.IntN(len(weighted))]:
			}
		}
	}()
	go func() { wg.Wait(); close(results) }()
	var all []benchResult
	for r := range results {
		all = append(all, r)
	}
	elapsed := time.Since(started)
	return reportBench(c, all, elapsed, *concurrency, stdout)
}

// runBenchCall makes one call and follows it to its final state.
func runBenchCall(c *client, job benchCall) benchResult {
	began := time.Now()
	res := benchResult{kind: job.name}
	var r call.Result
	_, err := c.do(context.Background(), http.MethodPost, "/v1/calls", job.body, &r)
	for err == nil && !r.Status.Terminal() && r.Status != call.StatusPendingApproval {
		_, err = c.do(context.Background(), http.MethodGet, "/v1/calls/"+r.ID+"?wait=60s", nil, &r)
	}
	res.id, res.status, res.err, res.latency = r.ID, r.Status, err, time.Since(began)
	return res
}

// reportBench prints throughput, latency percentiles and final-state counts, and checks that every
// accepted call has exactly one final state that does not change when read again.
func reportBench(c *client, all []benchResult, elapsed time.Duration, concurrency int, stdout io.Writer) error {
	counts := map[string]int{}
	var lat []time.Duration
	seen := map[string]call.Status{}
	var problems, requestErrors []string
	for _, r := range all {
		switch {
		case r.err != nil:
			counts["request_error"]++
			if counts["request_error"] <= 3 {
				requestErrors = append(requestErrors, r.err.Error())
			}
		default:
			counts[string(r.status)]++
			lat = append(lat, r.latency)
			if prev, dup := seen[r.id]; dup {
				problems = append(problems, fmt.Sprintf("call %s returned twice (%s, %s)", r.id, prev, r.status))
			}
			seen[r.id] = r.status
		}
	}
	// Read every call again: its final state must be recorded, once, and unchanged.
	for id, st := range seen {
		var r call.Result
		if _, err := c.do(context.Background(), http.MethodGet, "/v1/calls/"+id, nil, &r); err != nil {
			problems = append(problems, fmt.Sprintf("call %s: %v", id, err))
		} else if r.Status != st {
			problems = append(problems, fmt.Sprintf("call %s was %s, now reads %s", id, st, r.Status))
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		i := max(0, min(len(lat)-1, int(float64(len(lat))*p/100+0.5)-1))
		return lat[i]
	}
	fmt.Fprintf(stdout, "calls        %d in %s at concurrency %d\n", len(all), elapsed.Round(time.Millisecond), concurrency)
	fmt.Fprintf(stdout, "throughput   %.1f calls/s\n", float64(len(lat))/elapsed.Seconds())
	fmt.Fprintf(stdout, "latency      p50 %s  p95 %s  p99 %s  max %s\n", ms(pct(50)), ms(pct(95)), ms(pct(99)), ms(pct(100)))
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	fmt.Fprintf(stdout, "final states %s\n", strings.Join(parts, ", "))
	for _, e := range requestErrors {
		fmt.Fprintln(stdout, "request error", e)
	}
	if len(problems) > 0 {
		for _, p := range problems[:min(len(problems), 20)] {
			fmt.Fprintln(stdout, "PROBLEM", p)
		}
		return fmt.Errorf("%d calls without exactly one final state", len(problems))
	}
	fmt.Fprintf(stdout, "exactly one final state for %d of %d calls\n", len(seen), len(seen))
	if counts["request_error"] > 0 {
		return errors.New("some requests failed")
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
