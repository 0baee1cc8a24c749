package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Checkpoints is the object store that keeps workspaces' checkpoints (internal/checkpoint's Store): the
// object store <bucket>_checkpoints, replicated like the records, with no TTL (a checkpoint is the
// workspace). Its reads go to the stream's leader, never to a replica that may lag: a worker that read a
// workspace's head from a lagging replica would run a call on an old tree. Safe for concurrent use; it
// lives as long as its Conn.
type Checkpoints struct {
	*session
	store jetstream.ObjectStore
}

// checkpointTimeout bounds one object's Put or Open whose ctx has no deadline (nats.go would otherwise
// give each chunk its default five seconds).
const checkpointTimeout = 2 * time.Minute

// Checkpoints opens the checkpoint object store, creating it if it is missing (the first worker that
// keeps checkpoints makes it, with the replicas of the calls stream).
func (c *Conn) Checkpoints(ctx context.Context) (*Checkpoints, error) {
	c.ckptOnce.Do(func() {
		// Several workers starting at once on a cluster create and update the same stream: JetStream may
		// not answer in time while it places it (measured: three workers on a fresh 3-server cluster).
		err := whileClusterForms(ctx, provisionWait, func() (err error) {
			c.ckpt, err = openCheckpoints(ctx, c.session)
			return err
		})
		c.ckptErr = err
	})
	return c.ckpt, c.ckptErr
}

// ckptState is the Conn's lazily opened checkpoint store.
type ckptState struct {
	ckptOnce sync.Once
	ckpt     *Checkpoints
	ckptErr  error
}

func openCheckpoints(ctx context.Context, s *session) (*Checkpoints, error) {
	bucket := s.cfg.checkpointBucket()
	_, err := s.js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = s.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      bucket,
			Description: "toolpool workspace checkpoints: chunks, trees and heads by tenant",
			Storage:     jetstream.FileStorage,
			Replicas:    s.cfg.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another worker made it meanwhile
		}
	}
	if err != nil {
		return nil, explainCreate("object store "+bucket, s.cfg.Replicas, err)
	}
	// Reads from the leader only: the object store is made with direct gets, which any replica answers.
	st, err := s.js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("open object store %s: %w", bucket, err)
	}
	if cfg := st.CachedInfo().Config; cfg.AllowDirect {
		cfg.AllowDirect = false
		if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("make object store %s read from its leader: %w", bucket, err)
		}
	}
	store, err := s.js.ObjectStore(ctx, bucket) // bound after the update: it reads without direct gets
	if err != nil {
		return nil, fmt.Errorf("open object store %s: %w", bucket, err)
	}
	return &Checkpoints{session: s, store: store}, nil
}

// Put stores what r yields under name, replacing any object of that name.
func (s *Checkpoints) Put(ctx context.Context, name string, r io.Reader) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkpointTimeout)
		defer cancel()
	}
	if _, err := s.store.Put(ctx, jetstream.ObjectMeta{Name: name}, fullReads(r)); err != nil {
		return fmt.Errorf("store checkpoint object %s: %w", name, err)
	}
	return nil
}

// Open returns a reader of the object name, which the caller closes; an error wrapping os.ErrNotExist
// when there is none.
func (s *Checkpoints) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx) // the reader's, released when it is closed
	} else {
		ctx, cancel = context.WithTimeout(ctx, checkpointTimeout)
	}
	obj, err := s.store.Get(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		cancel()
		return nil, fmt.Errorf("read checkpoint object %s: %w", name, os.ErrNotExist)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("read checkpoint object %s: %w", name, err)
	}
	return &cancelOnClose{ReadCloser: obj, cancel: cancel}, nil
}

// Has reports whether there is an object name.
func (s *Checkpoints) Has(ctx context.Context, name string) (bool, error) {
	_, _, ok, err := s.Stat(ctx, name)
	return ok, err
}

// Stat returns the object name's size and when it was last written, by the server's clock; ok is false
// when there is none.
func (s *Checkpoints) Stat(ctx context.Context, name string) (size int64, modified time.Time, ok bool, err error) {
	info, err := s.store.GetInfo(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return 0, time.Time{}, false, nil
	case err != nil:
		return 0, time.Time{}, false, fmt.Errorf("look up checkpoint object %s: %w", name, err)
	}
	return int64(info.Size), info.ModTime, true, nil
}

// List calls fn with every object whose name begins with prefix. The object store's names are not in its
// subjects: it reads the metadata of every object of the bucket, every tenant's, and keeps prefix's.
func (s *Checkpoints) List(ctx context.Context, prefix string, fn func(name string, size int64, modified time.Time) error) error {
	infos, err := s.store.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list checkpoint objects %s*: %w", prefix, err)
	}
	for _, info := range infos {
		if strings.HasPrefix(info.Name, prefix) {
			if err := fn(info.Name, int64(info.Size), info.ModTime); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete removes the object name and its chunks; one that is not there is not an error.
func (s *Checkpoints) Delete(ctx context.Context, name string) error {
	err := s.store.Delete(ctx, name)
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete checkpoint object %s: %w", name, err)
	}
	return nil
}
