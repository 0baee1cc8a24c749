package containerd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// Deferred removal: a finished call's container (and a pooled one) is removed in the background, off the
// call's path, bounded by maxPendingCleanups; WaitCleanups (and Close) wait for it.

// maxPendingCleanups bounds the containers being removed in the background; a Run that would exceed it
// removes its container before it returns.
const maxPendingCleanups = 32

// removeLater removes a finished call's container and task in the background, on a fresh bounded
// context, runs then (when not nil), then releases the id. Config.OnCleanup hears how long it took and
// whether it failed.
func (r *Runtime) removeLater(ctx context.Context, id string, container containerd.Container, task containerd.Task, then func() error) {
	remove := func() {
		began := time.Now()
		var steps []sandbox.Step
		clock := stepClock{steps: &steps, last: began}
		err := r.remove(ctx, container, task, &clock)
		if then != nil {
			err = errors.Join(err, then())
			clock.done("slot")
		}
		r.end(id)
		if r.cfg.OnCleanup != nil {
			r.cfg.OnCleanup(time.Since(began), steps, err)
		}
	}
	select {
	case r.cleanupSlots <- struct{}{}:
	default:
		remove() // too many pending: this caller pays, which slows the intake
		return
	}
	r.cleanups.Add(1)
	go func() {
		defer r.cleanups.Done()
		defer func() { <-r.cleanupSlots }()
		// A moment later, off the call's path: the worker records the result and the dispatcher answers
		// in the next milliseconds, and the removal (runc kill and delete, the shim's exit) would take
		// their CPU.
		time.Sleep(removalDelay)
		remove()
	}()
}

// removalDelay is how long after its call a container's removal starts.
const removalDelay = 50 * time.Millisecond

// WaitCleanups blocks until every container of a finished call has been removed. Tests use it before
// they check that nothing is left; Close calls it.
func (r *Runtime) WaitCleanups() { r.cleanups.Wait() }

// remove deletes the task (killing it if it still runs) and the container with its snapshot, on a fresh
// bounded context, timing both on clock.
func (r *Runtime) remove(ctx context.Context, container containerd.Container, task containerd.Task, clock *stepClock) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if task == nil {
		// A creation cut short may have left a task its caller never got.
		if t, err := container.Task(cctx, nil); err == nil {
			task = t
		}
	}
	if task != nil {
		// A task whose process has exited is deleted as it is: WithProcessKill signals it first, which runc
		// answers with "not found" but runsc with an error that fails the delete.
		if _, err := task.Delete(cctx); err != nil && !errdefs.IsNotFound(err) {
			_, err := task.Delete(cctx, containerd.WithProcessKill)
			if err != nil && !errdefs.IsNotFound(err) && stopTask(cctx, task) == nil {
				// The shim refused ("cannot delete a running process"): the kill's exit had not reached it
				// yet. Once the task reports stopped, delete it again.
				_, err = task.Delete(cctx)
			}
			if err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", task.ID(), err))
			}
		}
	}
	clock.done("delete_task")
	if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container %s: %w", container.ID(), err))
	}
	clock.done("delete_container")
	return errors.Join(errs...)
}

// stopTask kills every process of task and waits, until ctx ends, for the shim to report it stopped.
func stopTask(ctx context.Context, task containerd.Task) error {
	if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill task %s: %w", task.ID(), err)
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := task.Status(ctx)
		if err != nil {
			return fmt.Errorf("status of task %s: %w", task.ID(), err)
		}
		if st.Status == containerd.Stopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for task %s to stop: %w", task.ID(), ctx.Err())
		case <-t.C:
		}
	}
}
