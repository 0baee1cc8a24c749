package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Locks are flock(2) locks on files in the shared workspaces directory, so that workers on different
// machines mounting one directory (NFS v4 and CephFS carry flock across clients) exclude each other. A lock
// file may be removed by whoever holds it exclusively (a deleted workspace): a waiter that then gets the
// lock on the removed file notices that the path now names another file, or none, and locks again.

// lock is a held lock; release it once.
type lock struct {
	f    *os.File
	path string
}

// acquire takes the lock at path, shared or exclusive, waiting until ctx ends. The lock file is created
// (mode 0600) if missing.
func acquire(ctx context.Context, path string, exclusive bool) (*lock, error) {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	wait := time.Millisecond
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		for {
			err = unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) {
				break
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
			case <-time.After(wait):
			}
			wait = min(2*wait, 100*time.Millisecond)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if samePath(f, path) {
			return &lock{f: f, path: path}, nil
		}
		f.Close() // removed by its last holder: lock the file that the path names now
	}
}

// tryAcquire takes the lock at path exclusively if nobody holds it; ok is false when someone does.
func tryAcquire(path string) (l *lock, ok bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l, err = acquire(ctx, path, true)
	if errors.Is(err, context.Canceled) {
		return nil, false, nil
	}
	return l, err == nil, err
}

func samePath(f *os.File, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Lstat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// touch records now as the lock's last use (its modification time).
func (l *lock) touch(now time.Time) {
	ts := unix.NsecToTimespec(now.UnixNano())
	_ = unix.UtimesNanoAt(unix.AT_FDCWD, l.path, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// remove deletes the lock file while holding it; release must still be called.
func (l *lock) remove() { _ = os.Remove(l.path) }

// release gives the lock up. Safe to call more than once.
func (l *lock) release() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the last descriptor releases the flock
		l.f = nil
	}
}
