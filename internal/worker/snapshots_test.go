package worker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/workspace"
)

// TestSnapshotsAcrossWorkers: two workers, each with its own workspaces directory, on one JetStream. A
// snapshot taken on a is restored on b, a fork on b copies a workspace written on a, and either worker's
// next call sees the result; info and list on b show what a wrote and snapshotted; a deleted workspace's
// snapshots go with it. Without checkpoint heads, the snapshot is a copy on a: b has no snapshot to
// restore, and lists only its own workspaces.
func TestSnapshotsAcrossWorkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	a, b := checkpointWorker(t, conn.Homes(), store, records, "a"), checkpointWorker(t, conn.Homes(), store, records, "b")
	handle := func(w *Worker, c *call.Call) *call.Result {
		t.Helper()
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		return records.Result(c.ID)
	}
	shell := func(w *Worker, ws, command string) *call.Result {
		t.Helper()
		c := newCall("run_shell", `{"command":"`+command+`"}`)
		c.Workspace = ws
		return handle(w, c)
	}
	op := func(w *Worker, tool, ws, args string) workspace.Output {
		t.Helper()
		c := newCall(tool, args)
		c.Workspace = ws
		r := handle(w, c)
		var out workspace.Output
		if r.Status != call.StatusOK || json.Unmarshal([]byte(r.Output), &out) != nil {
			t.Fatalf("%s of %s on %s: %s %+v %q", tool, ws, w.cfg.ID, r.Status, r.Error, r.Output)
		}
		return out
	}
	cat := func(w *Worker, ws, file, want string) {
		t.Helper()
		if r := shell(w, ws, "cat "+file); r.Status != call.StatusOK || r.Stdout != want {
			t.Fatalf("cat %s of %s on %s: %s %q %+v; want %q", file, ws, w.cfg.ID, r.Status, r.Stdout, r.Error, want)
		}
	}

	if r := shell(a, "ws", "write notes.txt one"); r.Status != call.StatusOK {
		t.Fatalf("write on a: %s %+v", r.Status, r.Error)
	}
	if s := op(a, workspace.OpSnapshot, "ws", `{"snapshot":"s1"}`); s.Workspace == nil || s.Workspace.Files != 1 || s.Workspace.Reflinked != nil {
		t.Fatalf("snapshot on a: %+v; want the workspace's one file, nothing reflinked or copied", s.Workspace)
	}
	if r := shell(a, "ws", "write notes.txt two"); r.Status != call.StatusOK {
		t.Fatalf("write on a: %s %+v", r.Status, r.Error)
	}
	if f := op(b, workspace.OpFork, "ws", `{"to":"copy"}`); f.Workspace == nil || f.Workspace.Name != "copy" {
		t.Fatalf("fork on b: %+v", f.Workspace)
	}
	op(b, workspace.OpRestore, "ws", `{"snapshot":"s1"}`)
	cat(b, "ws", "notes.txt", "one")
	cat(a, "ws", "notes.txt", "one")
	cat(a, "copy", "notes.txt", "two")

	inf := op(b, workspace.OpInfo, "ws", `{}`).Workspace
	if inf == nil || len(inf.Snapshots) != 1 || inf.Snapshots[0].Name != "s1" {
		t.Fatalf("info on b: %+v; want the snapshot taken on a", inf)
	}
	list := op(b, workspace.OpList, "", `{}`).Workspaces
	if len(list) != 2 || list[0].Name != "copy" || list[1].Name != "ws" || len(list[1].Snapshots) != 1 || list[1].Files != 1 || list[1].Bytes != 3 {
		t.Fatalf("list on b: %+v; want copy and ws (one file of 3 bytes, snapshot s1)", list)
	}

	c := newCall(workspace.OpRestore, `{"snapshot":"nope"}`)
	if r := handle(a, c); r.Error == nil || r.Error.Type != call.ErrNotFound || !strings.Contains(r.Error.Message, `has no snapshot "nope"`) {
		t.Fatalf("restore of a missing snapshot: %s %+v; want not_found", r.Status, r.Error)
	}
	c = newCall(workspace.OpFork, `{"to":"ws"}`)
	c.Workspace = "copy"
	if r := handle(a, c); r.Error == nil || r.Error.Type != workspace.TypeExists {
		t.Fatalf("fork to a workspace that exists: %s %+v; want already_exists", r.Status, r.Error)
	}

	op(a, workspace.OpDelete, "ws", `{}`)
	if list := op(b, workspace.OpList, "", `{}`).Workspaces; len(list) != 1 || list[0].Name != "copy" {
		t.Fatalf("list after the delete: %+v; want copy", list)
	}
	if r := shell(b, "ws", "write x y"); r.Status != call.StatusOK {
		t.Fatalf("a new ws: %s %+v", r.Status, r.Error)
	}
	if inf := op(a, workspace.OpInfo, "ws", `{}`).Workspace; inf == nil || len(inf.Snapshots) != 0 {
		t.Fatalf("info of a new workspace of a deleted one's name: %+v; want no snapshot", inf)
	}
}

// TestForkOnCheckpointsCountsWorkspaces: with checkpoints, a fork is counted against the tenant's number
// of workspaces from the shared heads, whichever worker made them: a fork past workspaces.max_per_tenant
// is refused (quota_exceeded, naming the largest), and nothing is written.
func TestForkOnCheckpointsCountsWorkspaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	other := checkpointWorker(t, conn.Homes(), store, records, "other")
	cfg := testConfig(t)
	cfg.Workspaces.MaxWorkspaces = 2
	cp, err := checkpoint.New(checkpoint.Config{Dir: cfg.WorkspacesDir, UID: testUID, GID: testGID, Worker: cfg.ID}, store, store)
	if err != nil {
		t.Fatal(err)
	}
	w := newTestWorkerWith(t, cfg, shellRuntime(t), records, WithLeases(newFakeLeases()), WithCheckpoints(cp), WithHomes(conn.Homes()))
	handle := func(w *Worker, tool, ws, args string) *call.Result {
		c := newCall(tool, args)
		c.Workspace = ws
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		return records.Result(c.ID)
	}
	for _, ws := range []string{"one", "two"} {
		if r := handle(other, "run_shell", ws, `{"command":"write f.txt `+ws+`"}`); r.Status != call.StatusOK {
			t.Fatalf("write into %s on the other worker: %s %+v", ws, r.Status, r.Error)
		}
	}
	r := handle(w, workspace.OpFork, "one", `{"to":"three"}`)
	if r.Error == nil || r.Error.Type != call.ErrQuota || !strings.Contains(r.Error.Message, "tenant t has 2 workspaces, its limit (workspaces.max_per_tenant)") ||
		!strings.Contains(r.Error.Message, "one (3 bytes)") {
		t.Fatalf("a fork past max_per_tenant: %s %+v; want quota_exceeded naming the workspaces", r.Status, r.Error)
	}
	if h, _, err := store.GetHead(ctx, "t", "three"); err != nil || h != nil {
		t.Fatalf("the refused fork's head: %q, %v; want none", h, err)
	}
	if r := handle(w, workspace.OpDelete, "two", `{}`); r.Status != call.StatusOK {
		t.Fatalf("delete: %s %+v", r.Status, r.Error)
	}
	if r := handle(w, workspace.OpFork, "one", `{"to":"three"}`); r.Status != call.StatusOK {
		t.Fatalf("a fork under max_per_tenant: %s %+v", r.Status, r.Error)
	}
}
