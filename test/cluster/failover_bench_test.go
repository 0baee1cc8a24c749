package cluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// TestFailoverBench measures what a workspace's failover costs, on the three-server NATS cluster with
// workers that keep workspaces in JetStream's object store with a short lease (heartbeat 500 ms, lease
// 2 s): worker w1, the only one, makes a workspace of 100 MB (100 files of 1 MB of random bytes) and runs
// a call in it; w2 starts, never having had the workspace; w1 is killed with kill -9 mid-call, and a
// call into the workspace is submitted at once. It reports the time from the kill until that call's
// command runs on w2 (the dead home's lease lapses, w2 claims the call, restores the 100 MB whole, starts
// the container; the goal is under 5 s), its restore time and throughput, and checks that the call sees
// every file. Run by make bench (TOOLPOOL_FAILOVER_BENCH=1).
func TestFailoverBench(t *testing.T) {
	if os.Getenv("TOOLPOOL_FAILOVER_BENCH") == "" {
		t.Skip("set TOOLPOOL_FAILOVER_BENCH=1 to run")
	}
	const (
		files   = 100
		fileMiB = 1
		total   = files * fileMiB << 20
	)
	p := startPoolTimed(t, true, 500*time.Millisecond, 2*time.Second)
	home := p.startWorkers(workerSpec{id: "w1", dataDir: filepath.Join(p.dir, "w1")})[0]
	urls := p.dispatcherURLs()
	// Policy checks every argument of a command line: the files are named, not looped over.
	var dds, names []string
	for i := range files {
		dds = append(dds, "dd if=/dev/urandom of=f"+strconv.Itoa(i)+" bs=1M count="+strconv.Itoa(fileMiB)+" status=none")
		names = append(names, "f"+strconv.Itoa(i))
	}
	r := p.runCall(urls[0], shellCall("big", strings.Join(dds, " && ")+" && ls | grep -c '^f'", true))
	if r.Status != call.StatusOK {
		t.Fatalf("make the 100 MB workspace: %s %+v %s", r.Status, r.Error, r.Output)
	}
	if got := strings.Fields(r.Stdout); len(got) == 0 || got[len(got)-1] != strconv.Itoa(files) {
		t.Fatalf("make the 100 MB workspace: %q; want %d files", r.Stdout, files)
	}
	t.Logf("100 MB workspace made on %s, checkpointed in %d ms", r.Worker, r.Timing.CheckpointMS)

	id, ok := submit(urls[0], shellCall("big", appendLineCmd("killed")+" && sleep 60", false))
	if !ok {
		t.Fatal("the call to kill was not accepted")
	}
	eventually(t, time.Minute, "the call to kill to run", func() bool {
		r, err := p.get(id)
		if err != nil || r.Status != call.StatusRunning {
			return false
		}
		b, _ := os.ReadFile(filepath.Join(home.dataDir, "ws", "t1", "big", "log.txt"))
		return strings.Contains(string(b), "killed")
	})
	fresh := p.startWorkers(workerSpec{id: "w2", dataDir: filepath.Join(p.dir, "w2")})[0]
	if _, err := os.Stat(filepath.Join(fresh.dataDir, "ws", "t1", "big")); !os.IsNotExist(err) {
		t.Fatalf("w2 has a copy of the workspace before the failover: %v", err)
	}
	load, _ := os.ReadFile("/proc/loadavg")

	home.proc.Kill9(t)
	killed := time.Now()
	next := p.runCall(urls[1], shellCall("big", "date +%s%N; ls | grep -c '^f'; cat "+strings.Join(names, " ")+" | wc -c", true))
	if next.Status != call.StatusOK || next.Worker != fresh.id {
		t.Fatalf("the call after the kill: %s on %s %+v %s; want ok on %s", next.Status, next.Worker, next.Error, next.Output, fresh.id)
	}
	out := strings.Fields(next.Stdout)
	if len(out) != 3 || out[1] != strconv.Itoa(files) || out[2] != strconv.Itoa(total) {
		t.Fatalf("the call after the kill saw %q; want %d files of %d bytes in all", next.Stdout, files, total)
	}
	ns, err := strconv.ParseInt(out[0], 10, 64)
	if err != nil {
		t.Fatalf("the call's clock: %q", out[0])
	}
	failover := time.Unix(0, ns).Sub(killed)
	restore := time.Duration(next.Timing.RestoreMS) * time.Millisecond
	t.Logf("failover of a 100 MB workspace (lease 2s): kill -9 of %s, the next call's command ran on %s %s after the kill "+
		"(claimed %s after it; restore %s, %.0f MB/s; goal under 5s); load average %s",
		home.id, fresh.id, failover.Round(time.Millisecond), next.StartedAt.Sub(killed).Round(time.Millisecond), restore,
		float64(total)/(1<<20)/restore.Seconds(), strings.Join(strings.Fields(string(load))[:3], " "))
	if failover > 5*time.Second {
		t.Logf("over the 5 s goal")
	}
}
