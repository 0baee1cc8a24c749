package containerd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
)

// OwnerGone reports whether the call a container was made for has no live owner any more (its lease is
// gone): then any worker may remove the container.
type OwnerGone func(ctx context.Context, callID string) (bool, error)

// RemoveOrphans deletes what an earlier worker with the same WorkerID and StateDir left behind when it
// crashed (or what calls left when containerd died under them): its containers with their tasks (killing
// every process still running) and snapshots, snapshots it created for a container it never recorded,
// tasks whose container record is gone and shims containerd no longer knows, the task rootfs mounts and
// cgroups of what it removes, the FIFO directories of its calls and the host-view roots of earlier
// Runtimes. It returns how many containers it removed. Call it before the first Run; it is also safe while
// calls run, because it leaves alone every call this Runtime is running (their own cleanup is theirs).
// Other workers' containers (another WorkerID in the same namespace) are not touched.
func (r *Runtime) RemoveOrphans(ctx context.Context) (int, error) {
	return r.RemoveOrphansOf(ctx, nil)
}

// PoolOwnerStale is how long a pooled container of another worker may go without its owner's sign of
// life before RemoveOrphansOf counts its owner gone. A pooled container serves no call of its own (its id
// is not a call's), so no lease tells whether its owner lives: instead every RemoveOrphans and
// RemoveOrphansOf marks this Runtime's pooled containers alive (a label, which sets the container record's
// UpdatedAt in containerd). A worker that shares its containerd with others must call one of them at least
// every PoolOwnerStale/2 while it runs (the worker sweeps once per lease, at most every PoolOwnerStale/4).
const PoolOwnerStale = 2 * time.Minute

// poolOwnerStale is PoolOwnerStale; tests shorten it.
var poolOwnerStale = PoolOwnerStale

// labelPoolAlive is the label a live Runtime rewrites on its pooled containers: its clock, in Unix
// nanoseconds, when it last swept (for people reading `ctr containers info`; the judgement is UpdatedAt).
const labelPoolAlive = "toolpool.pool.alive"

// RemoveOrphansOf is RemoveOrphans that also removes the containers of other workers (any WorkerID in the
// namespace: a crashed worker replaced under another id, a worker sharing this containerd): a call's
// container when gone reports true for its call, a pooled container (ready or claimed) when its owner has
// not marked it alive for PoolOwnerStale. A container for which gone fails or reports false is left alone:
// its owner may be alive.
func (r *Runtime) RemoveOrphansOf(ctx context.Context, gone OwnerGone) (int, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	markErr := r.markPoolAlive(ctx)
	filter := fmt.Sprintf("labels.%q==%s", labelWorker, r.cfg.WorkerID)
	if gone != nil {
		filter = fmt.Sprintf("labels.%q", labelWorker)
	}
	list, err := r.client.Containers(ctx, filter)
	if err != nil {
		return 0, fmt.Errorf("list orphan containers: %w", err)
	}
	var errs []error
	ids := make(map[string]bool, len(list))
	removed := 0
	for _, c := range list {
		if r.running(c.ID()) {
			continue
		}
		if !r.ownOrGone(ctx, c, gone) {
			continue
		}
		removed++
		ids[c.ID()] = true
		task, err := c.Task(ctx, nil)
		if err != nil {
			task = nil
		}
		if err := r.remove(ctx, c, task, nil); err != nil {
			errs = append(errs, err)
		}
	}
	swept, err := r.removeTasksWithoutContainers(ctx)
	errs = append(errs, err)
	for _, id := range swept {
		ids[id] = true
	}
	errs = append(errs, r.removeOrphanSnapshots(ctx, ids))
	strays, err := r.removeStrayShims(ctx)
	errs = append(errs, err)
	for _, id := range strays {
		ids[id] = true
	}
	for id := range ids {
		errs = append(errs, r.removeTaskMounts(id), r.removeCgroups(id))
	}
	errs = append(errs, r.removeFIFODirs(), r.removeOldRoots(), r.removeOldSlots(), r.removeOldViews(), markErr)
	return removed, errors.Join(errs...)
}

// markPoolAlive marks this Runtime's pooled containers alive for other workers' RemoveOrphansOf.
func (r *Runtime) markPoolAlive(ctx context.Context) error {
	list, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q", labelWorker, r.cfg.WorkerID, labelPool))
	if err != nil {
		return fmt.Errorf("list pooled containers to mark alive: %w", err)
	}
	var errs []error
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, c := range list {
		if _, err := c.SetLabels(ctx, map[string]string{labelPoolAlive: now}); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("mark pooled container %s alive: %w", c.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// ownOrGone reports whether container c is this worker's (by WorkerID) or its owner is gone: for a call's
// container, as gone says; for a pooled one, when its owner has not marked it alive for poolOwnerStale.
func (r *Runtime) ownOrGone(ctx context.Context, c containerd.Container, gone OwnerGone) bool {
	info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return false
	}
	if info.Labels[labelWorker] == r.cfg.WorkerID {
		return true
	}
	if gone == nil {
		return false
	}
	if info.Labels[labelPool] != "" {
		return time.Since(info.UpdatedAt) > poolOwnerStale
	}
	g, err := gone(ctx, c.ID())
	return err == nil && g
}

// removeTasksWithoutContainers kills and deletes the tasks in the namespace whose container record is gone:
// a worker that dies while containerd is still creating a call's task can leave a task (and its shim and
// processes) whose container was already deleted. No live worker owns such a task, whatever its WorkerID.
func (r *Runtime) removeTasksWithoutContainers(ctx context.Context) ([]string, error) {
	resp, err := r.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list orphan tasks: %w", err)
	}
	var ids []string
	var errs []error
	for _, p := range resp.Tasks {
		if r.running(p.ID) {
			continue
		}
		if _, err := r.client.ContainerService().Get(ctx, p.ID); !errdefs.IsNotFound(err) {
			continue
		}
		ids = append(ids, p.ID)
		cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		_, _ = r.client.TaskService().Kill(cctx, &tasks.KillRequest{ContainerID: p.ID, Signal: uint32(syscall.SIGKILL), All: true})
		_, err := r.client.TaskService().Delete(cctx, &tasks.DeleteTaskRequest{ContainerID: p.ID})
		cancel()
		if err = errdefs.FromGRPC(err); err != nil && !errdefs.IsNotFound(err) { // gone meanwhile: its own cleanup won
			errs = append(errs, fmt.Errorf("delete orphan task %s: %w", p.ID, err))
		}
	}
	return ids, errors.Join(errs...)
}

// removeStrayShims kills the shims of this containerd and namespace that serve a task containerd no longer
// knows: when a worker dies while containerd creates a task, containerd can give up on the task ("shim
// disconnected") while the shim process lives on, holding the call's processes. It returns their ids.
func (r *Runtime) removeStrayShims(ctx context.Context) ([]string, error) {
	resp, err := r.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	known := map[string]bool{}
	for _, p := range resp.Tasks {
		known[p.ID] = true
	}
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var ids []string
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(filepath.Base(string(b[:max(0, bytes.IndexByte(b, 0))])), "containerd-shim") {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		flag := func(name string) string {
			for i := 1; i+1 < len(args); i++ {
				if args[i] == name {
					return args[i+1]
				}
			}
			return ""
		}
		id := flag("-id")
		if flag("-namespace") != r.cfg.Namespace || flag("-address") != r.cfg.Address || id == "" || known[id] || r.running(id) {
			continue
		}
		if _, err := r.client.ContainerService().Get(ctx, id); !errdefs.IsNotFound(err) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if r.shimServesLive(pid, known) {
			continue // a grouped shim (ShimGroups) outlives the container that started it
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill stray shim %d of %s: %w", pid, id, err))
			continue
		}
		ids = append(ids, id)
	}
	return ids, errors.Join(errs...)
}

// shimServesLive reports whether the shim pid still serves a container that containerd knows or that this
// Runtime runs: one of its children lives in such a container's cgroup.
func (r *Runtime) shimServesLive(pid int, known map[string]bool) bool {
	for _, child := range childPIDs(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", child))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			_, p, ok := strings.Cut(line, ":/"+r.cfg.Namespace+"/")
			if !ok {
				_, p, ok = strings.Cut(line, "/"+r.cfg.Namespace+"/")
			}
			if id, _, _ := strings.Cut(p, "/"); ok && id != "" && (known[id] || r.running(id)) {
				return true
			}
		}
	}
	return false
}

// removeOldSlots removes the pool slot directories of earlier Runtimes on this StateDir, and those of
// this Runtime's pool whose container is gone, unmounting what is still mounted on them.
func (r *Runtime) removeOldSlots() error {
	old, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, slotsPrefix+"*"))
	var errs []error
	for _, dir := range old {
		if r.slots != nil && dir == r.slots.dir {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if !r.running(e.Name()) {
					errs = append(errs, removeSlotDir(filepath.Join(dir, e.Name())))
				}
			}
			continue
		}
		errs = append(errs, removeSlotsTree(dir))
	}
	return errors.Join(errs...)
}

// removeOldRoots removes the host-view roots of earlier Runtimes on this StateDir.
func (r *Runtime) removeOldRoots() error {
	old, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "rootfs*"))
	var errs []error
	for _, dir := range old {
		if dir == r.rootfs.path {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove old root %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// removeOrphanSnapshots removes the snapshots labelled with this worker that no container uses any more,
// and those of the containers of other workers that were just removed (removed, by id).
func (r *Runtime) removeOrphanSnapshots(ctx context.Context, removed map[string]bool) error {
	sn := r.client.SnapshotService(snapshotter)
	var keys []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Labels[labelWorker] == r.cfg.WorkerID || removed[info.Name] {
			keys = append(keys, info.Name)
		}
		return nil
	}, fmt.Sprintf("labels.%q", labelWorker))
	if err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsNotImplemented(err) {
			return nil // no overlayfs snapshotter: no image calls, no snapshots
		}
		return fmt.Errorf("list orphan snapshots: %w", err)
	}
	var errs []error
	for _, k := range keys {
		if r.running(k) {
			continue // a call of ours is creating its container on it
		}
		if _, err := r.client.ContainerService().Get(ctx, k); err == nil {
			continue // a live container still holds it
		}
		if err := sn.Remove(ctx, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove orphan snapshot %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// removeTaskMounts unmounts what is still mounted for container id in the runtime's task directories (the
// rootfs of an image call whose shim died), lazily, deepest first.
func (r *Runtime) removeTaskMounts(id string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	marker := "/" + r.cfg.Namespace + "/" + id + "/"
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPoint(fields[4])
		if strings.Contains(p+"/", marker) && strings.Contains(p, "io.containerd.runtime.") {
			points = append(points, p)
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := mount.UnmountAll(points[i], mntDetach); err != nil {
			errs = append(errs, fmt.Errorf("unmount orphan %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}

// mntDetach is MNT_DETACH: unmount now, release when no longer busy.
const mntDetach = 0x2

func unescapeMountPoint(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// removeCgroups removes container id's cgroup directories, in every v1 hierarchy and in the v2 one, after
// killing any process still in them (a container whose shim died can leave its processes running).
func (r *Runtime) removeCgroups(id string) error {
	rel := filepath.Join(r.cfg.Namespace, id)
	candidates := []string{filepath.Join("/sys/fs/cgroup", rel), filepath.Join("/sys/fs/cgroup/unified", rel)}
	if hier, err := os.ReadDir("/sys/fs/cgroup"); err == nil {
		for _, h := range hier {
			if h.IsDir() {
				candidates = append(candidates, filepath.Join("/sys/fs/cgroup", h.Name(), rel))
			}
		}
	}
	var errs []error
	for _, dir := range candidates {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
			continue
		}
		if err := killCgroup(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := removeCgroupDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupDir removes an empty cgroup, waiting up to a few seconds while the kernel still counts
// processes that were killed but not yet reaped (EBUSY).
func removeCgroupDir(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove orphan cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeFIFODirs empties the runtime's FIFO directory but for the calls it runs: each call's FIFOs live in
// a directory named by its id, removed when the call ends, so whatever else is left belongs to calls of a
// crashed worker.
func (r *Runtime) removeFIFODirs() error {
	entries, err := os.ReadDir(r.fifos)
	if err != nil {
		return fmt.Errorf("read fifo dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if r.running(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(r.fifos, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove orphan fifos: %w", err))
		}
	}
	return errors.Join(errs...)
}

// killCgroup SIGKILLs every process in the cgroup dir until it is empty, for at most a few seconds.
func killCgroup(dir string) error {
	// cgroup v2 kills the whole cgroup at once; v1 has no such file and is killed one process at a time.
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("read orphan cgroup %s: %w", dir, err)
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill orphan cgroup %s: %d processes still in it", dir, len(pids))
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}
