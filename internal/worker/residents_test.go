package worker

import (
	"context"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// TestResidentRecorded: a worker that keeps workspaces in object storage records itself as the resident
// of the workspace of each call it runs (before the call's result is out), on the real residents of an
// in-process JetStream: the workspace's resident moves with the calls; a call that names no workspace
// records none.
func TestResidentRecorded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	res := conn.Residents()
	a := checkpointWorker(t, conn.Homes(), store, records, "a", WithResidents(res))
	b := checkpointWorker(t, conn.Homes(), store, records, "b", WithResidents(res))
	run := func(w *Worker, workspace, command string) {
		t.Helper()
		c := newCall("run_shell", `{"command":"`+command+`"}`)
		c.Workspace = workspace
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		if r := records.Result(c.ID); workspace != "" && r.Status != call.StatusOK {
			t.Fatalf("%s on %s: %s %+v", command, workspace, r.Status, r.Error)
		}
	}
	resident := func(workspace string) string {
		t.Helper()
		got, err := res.ResidentOf(ctx, "t", workspace)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	run(a, "ws", "write notes.txt x")
	if got := resident("ws"); got != "a" {
		t.Fatalf("resident after a call on a = %q; want a", got)
	}
	run(b, "ws", "cat notes.txt")
	if got := resident("ws"); got != "b" {
		t.Fatalf("resident after a call on b = %q; want b (it restored the workspace)", got)
	}
	run(a, "", "cat notes.txt")
	if got := resident("ws"); got != "b" {
		t.Fatalf("resident after a call naming no workspace = %q; want b still", got)
	}
}
