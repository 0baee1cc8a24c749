package workspace

import (
	"context"
	"os"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// TestWorkspaceImage: a workspace's default image is kept in its metadata, described by Info and List,
// read by Prepare for its calls, kept by a fork, dropped with the workspace, and refused on a workspace
// that does not exist; metadata that does not decode fails the call rather than running it elsewhere.
func TestWorkspaceImage(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{})
	const img = "registry.example.com/tools/python:3.12"
	if _, err := m.Create(ctx, "t1", "ws", nil); err != nil {
		t.Fatal(err)
	}
	if ws, err := m.Prepare("t1", "ws"); err != nil || ws.Image != "" {
		t.Fatalf("Prepare before SetImage = %+v, %v; want no image", ws, err)
	}
	inf, err := m.SetImage(ctx, "t1", "ws", img)
	if err != nil || inf.Image != img || inf.CreatedAt.IsZero() {
		t.Fatalf("SetImage = %+v, %v", inf, err)
	}
	if inf, err := m.Info(ctx, "t1", "ws"); err != nil || inf.Image != img {
		t.Fatalf("Info = %+v, %v; want image %s", inf, err, img)
	}
	if list, err := m.List(ctx, "t1"); err != nil || len(list) != 1 || list[0].Image != img {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if ws, err := m.Prepare("t1", "ws"); err != nil || ws.Image != img {
		t.Fatalf("Prepare = %+v, %v; want image %s", ws, err, img)
	}
	if inf, err := m.Fork(ctx, "t1", "ws", "", "copy"); err != nil || inf.Image != img {
		t.Fatalf("Fork = %+v, %v; want the source's image", inf, err)
	}
	// Another tenant's workspace of the same name has none.
	if ws, err := m.Prepare("t2", "ws"); err != nil || ws.Image != "" {
		t.Fatalf("Prepare of t2/ws = %+v, %v", ws, err)
	}
	// A workspace a call made (no metadata) can be given one; "" takes it away.
	if _, err := m.SetImage(ctx, "t2", "ws", img); err != nil {
		t.Fatal(err)
	}
	if inf, err := m.SetImage(ctx, "t2", "ws", ""); err != nil || inf.Image != "" {
		t.Fatalf("SetImage(\"\") = %+v, %v", inf, err)
	}
	_, err = m.SetImage(ctx, "t1", "nosuch", img)
	wantErr(t, err, call.ErrNotFound, `no workspace "nosuch"`)
	_, err = m.SetImage(ctx, "t1", "../x", img)
	wantErr(t, err, call.ErrInvalidParams, "workspace")

	if err := m.Delete(ctx, "t1", "ws"); err != nil {
		t.Fatal(err)
	}
	if ws, err := m.Prepare("t1", "ws"); err != nil || ws.Image != "" {
		t.Fatalf("Prepare after delete = %+v, %v; want no image", ws, err)
	}
	if err := os.WriteFile(m.metaPath("t1", "copy"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Prepare("t1", "copy"); err == nil {
		t.Fatal("Prepare with broken metadata succeeded; want an error")
	}
}
