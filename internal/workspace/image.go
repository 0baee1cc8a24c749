// A workspace's default image: the OCI image reference its calls run on when they ask for none
// (docs/images.md), kept in the workspace's metadata, beside it and out of every call's reach.

package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// SetImage makes image (a reference, "" for none) the default image of existing workspace name and
// returns its description. The caller has checked the reference (the dispatcher, against policy): this
// package keeps it as given. It waits for running calls in the workspace to end, so that a call runs on
// one image from start to end; a workspace that does not exist is not_found.
func (m *Manager) SetImage(ctx context.Context, tenant, name, image string) (Info, error) {
	if err := checkNames(tenant, name); err != nil {
		return Info{}, err
	}
	l, err := m.lockWorkspace(ctx, tenant, name, true)
	if err != nil {
		return Info{}, err
	}
	defer l.release()
	if ok, err := m.exists(tenant, name); err != nil || !ok {
		if err == nil {
			err = notFound(name)
		}
		return Info{}, err
	}
	md, err := m.readMeta(tenant, name)
	if err != nil {
		return Info{}, err
	}
	if md.CreatedAt.IsZero() { // made by a call, never created: its metadata starts now
		md.CreatedAt = m.cfg.Now().UTC()
	}
	md.Image = image
	if err := m.writeMeta(tenant, name, md); err != nil {
		return Info{}, err
	}
	return m.info(tenant, name)
}

// readMeta reads workspace name's metadata: the zero meta when it has none (a workspace a call made), an
// error when the file cannot be read or decoded.
func (m *Manager) readMeta(tenant, name string) (meta, error) {
	var md meta
	b, err := os.ReadFile(m.metaPath(tenant, name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return md, nil
	case err != nil:
		return md, fmt.Errorf("read workspace metadata: %w", err)
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return md, fmt.Errorf("read workspace metadata %s: %w", m.metaPath(tenant, name), err)
	}
	return md, nil
}

// ImageOf returns workspace name's default image as this host's metadata keeps it ("" for none), without
// waiting for its calls: what a worker that keeps workspaces in object storage records in the
// workspace's checkpoint.
func (m *Manager) ImageOf(tenant, name string) (string, error) {
	if err := checkNames(tenant, name); err != nil {
		return "", err
	}
	md, err := m.readMeta(tenant, name)
	return md.Image, err
}

// KeepImage makes image the default image of workspace name in this host's metadata, without waiting for
// its calls: a worker that brought its copy to a checkpoint naming another image (set on another worker)
// records it there. The caller keeps other writers of the workspace out (its home).
func (m *Manager) KeepImage(tenant, name, image string) error {
	if err := checkNames(tenant, name); err != nil {
		return err
	}
	if err := m.prepareTenant(tenant); err != nil {
		return err
	}
	md, err := m.readMeta(tenant, name)
	if err != nil {
		return err
	}
	if md.Image == image {
		return nil
	}
	if md.CreatedAt.IsZero() {
		md.CreatedAt = m.cfg.Now().UTC()
	}
	md.Image = image
	return m.writeMeta(tenant, name, md)
}
