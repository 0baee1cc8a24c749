package executor

import (
	"context"
	"fmt"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// imageRuntime records the Spec's image and answers with err, or with a run on the image by digest.
type imageRuntime struct {
	fakeRuntime
	err error
}

func (f *imageRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	out, _ := f.fakeRuntime.Run(ctx, spec)
	if f.err != nil {
		return sandbox.Outcome{WorkspaceBytes: -1}, f.err
	}
	out.Image = "reg.example/tools/python@sha256:abc"
	return out, nil
}

func TestCallImageReachesTheSpecAndTheResult(t *testing.T) {
	rt := &imageRuntime{}
	e, _ := newTestExecutor(t, rt, 0, nil)
	e.cfg.Image = "reg.example/worker/default:1"

	c := newCall("run_shell", shellArgs)
	c.Image = "reg.example/tools/python:3.12"
	r := runCall(e, c)
	if got := rt.specs[0].Image; got != c.Image || rt.specs[0].Tenant != c.Tenant {
		t.Errorf("spec image %q of tenant %q, want the call's %q of %q (whose registry credentials pull it)", got, rt.specs[0].Tenant, c.Image, c.Tenant)
	}
	if r.Status != call.StatusOK || r.Image != "reg.example/tools/python@sha256:abc" {
		t.Errorf("result status %s image %q, want ok on the image by digest", r.Status, r.Image)
	}

	runCall(e, newCall("run_shell", shellArgs))
	if got := rt.specs[1].Image; got != e.cfg.Image {
		t.Errorf("spec image %q for a call without one, want the worker's default %q", got, e.cfg.Image)
	}
}

func TestImageFailuresEndTheCall(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %w: pull x: registry r cannot be reached", sandbox.ErrNotStarted, sandbox.ErrImagePull), call.ErrImagePullFailed},
		{fmt.Errorf("%w: %w: layer 2: device node", sandbox.ErrNotStarted, sandbox.ErrImageRefused), call.ErrImageRefused},
	} {
		e, _ := newTestExecutor(t, &imageRuntime{err: tt.err}, 0, nil)
		c := newCall("run_shell", shellArgs)
		c.Image = "reg.example/tools/python:3.12"
		r := runCall(e, c)
		if r.Status != call.StatusError || r.Error == nil || r.Error.Type != tt.want {
			t.Fatalf("result %s %+v, want error %s", r.Status, r.Error, tt.want)
		}
		t.Log(r.Error.Message)
	}
}

// TestImageOrder: a call runs on the first of its own image, its workspace's default, its tenant's
// default and the worker's default.
func TestImageOrder(t *testing.T) {
	rt := &imageRuntime{}
	e, wsm := newTestExecutor(t, rt, 0, nil)
	e.cfg.Image = "reg.example/worker/default:1"
	const own, wsImage, tenant = "reg.example/own:1", "reg.example/workspace:1", "reg.example/tenant:1"
	if _, err := wsm.Create(context.Background(), "t", "ws", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := wsm.SetImage(context.Background(), "t", "ws", wsImage); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		workspace, image, tenant, want string
	}{
		{"ws", own, tenant, own},
		{"ws", "", tenant, wsImage},
		{"other", "", tenant, tenant},
		{"other", "", "", e.cfg.Image},
	} {
		c := newCall("run_shell", shellArgs)
		c.Workspace, c.Image, c.TenantImage = tt.workspace, tt.image, tt.tenant
		if r := runCall(e, c); r.Status != call.StatusOK {
			t.Fatalf("%+v: status %s %+v", tt, r.Status, r.Error)
		}
		if got := rt.specs[len(rt.specs)-1].Image; got != tt.want {
			t.Errorf("workspace %s, call image %q, tenant image %q: spec image %q, want %q", tt.workspace, tt.image, tt.tenant, got, tt.want)
		}
	}
}

// pullingRuntime reports a pull of the spec's image before it runs it, as a runtime that lacks it does.
type pullingRuntime struct{ imageRuntime }

func (f *pullingRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	if spec.OnPull != nil {
		spec.OnPull(sandbox.PullProgress{Image: spec.Image, Done: 10, Total: 40, Phase: sandbox.PullFetching})
		spec.OnPull(sandbox.PullProgress{Image: spec.Image, Done: 40, Total: 40, Phase: sandbox.PullDone})
	}
	return f.imageRuntime.Run(ctx, spec)
}

// TestPullProgressReachesTheCaller: the runtime's pull reports reach Run's onPull as the call's
// PullProgress; a call on the host view has no image and nothing to pull.
func TestPullProgressReachesTheCaller(t *testing.T) {
	rt := &pullingRuntime{}
	e, _ := newTestExecutor(t, rt, 0, nil)
	var got []call.PullProgress
	onPull := func(p call.PullProgress) { got = append(got, p) }
	c := newCall("run_shell", shellArgs)
	c.Image = "reg.example/tools/python:3.12"
	x, err := e.Run(context.Background(), c, nil, onPull)
	e.Finish(call.NewResult(c, call.StatusRunning), c, x, err, nil)
	want := []call.PullProgress{{Image: c.Image, BytesDone: 10, BytesTotal: 40, Phase: "fetching"}, {Image: c.Image, BytesDone: 40, BytesTotal: 40, Phase: "done"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("onPull heard %+v, want %+v", got, want)
	}
	got = nil
	if _, err := e.Run(context.Background(), newCall("run_shell", shellArgs), nil, onPull); err != nil || got != nil || rt.specs[1].OnPull != nil {
		t.Errorf("a host-view call: err %v, heard %+v", err, got)
	}
}
