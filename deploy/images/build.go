package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// options is what one image is made of.
type options struct {
	name, out     string
	layers        []string
	entrypoint    []string
	cmd           []string
	env           []string
	labels        map[string]string
	expose        []string
	user, workdir string
	epoch         int64
}

func (o options) validate() error {
	var errs []error
	if o.name == "" {
		errs = append(errs, errors.New("-name is required: the reference the archive records, e.g. toolpool.local/worker:dev"))
	}
	if o.out == "" {
		errs = append(errs, errors.New("-o is required: the OCI archive to write"))
	}
	if len(o.layers) == 0 {
		errs = append(errs, errors.New("give at least one -layer directory"))
	}
	for _, l := range o.layers {
		if st, err := os.Stat(l); err != nil {
			errs = append(errs, fmt.Errorf("-layer %s: %w", l, err))
		} else if !st.IsDir() {
			errs = append(errs, fmt.Errorf("-layer %s: not a directory", l))
		}
	}
	for _, e := range o.env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("-env %q: want KEY=VALUE", e))
		}
	}
	if o.epoch < 0 {
		errs = append(errs, fmt.Errorf("-epoch %d: want seconds since 1970, not negative", o.epoch))
	}
	return errors.Join(errs...)
}

// build writes the image o describes to o.out and returns its manifest digest.
func build(o options) (string, error) {
	if err := o.validate(); err != nil {
		return "", err
	}
	created := v1.Time{Time: time.Unix(o.epoch, 0).UTC()}
	tmp, err := os.MkdirTemp(filepath.Dir(o.out), ".images-")
	if err != nil {
		return "", fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, dir := range o.layers {
		tarPath := filepath.Join(tmp, fmt.Sprintf("layer%d.tar", i))
		if err := writeTree(tarPath, dir, o.epoch); err != nil {
			return "", fmt.Errorf("layer %s: %w", dir, err)
		}
		layer, err := tarball.LayerFromFile(tarPath, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return "", fmt.Errorf("layer %s: %w", dir, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
			Created:   created,
			CreatedBy: fmt.Sprintf("images -layer #%d", i+1),
		}})
		if err != nil {
			return "", fmt.Errorf("append layer %s: %w", dir, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = runtime.GOARCH, "linux", created
	cf.Config.Entrypoint, cf.Config.Cmd = o.entrypoint, o.cmd
	cf.Config.Env, cf.Config.User, cf.Config.WorkingDir = o.env, o.user, o.workdir
	if len(o.labels) > 0 {
		cf.Config.Labels = o.labels
	}
	if len(o.expose) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range o.expose {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", fmt.Errorf("set config: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("compute digest: %w", err)
	}

	dir := filepath.Join(tmp, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("write OCI layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.name,
		"io.containerd.image.name":          o.name,
	})); err != nil {
		return "", fmt.Errorf("write OCI layout: %w", err)
	}
	part := o.out + ".part"
	if err := writeTree(part, dir, o.epoch); err != nil {
		return "", fmt.Errorf("write %s: %w", o.out, err)
	}
	if err := os.Rename(part, o.out); err != nil {
		return "", fmt.Errorf("write %s: %w", o.out, err)
	}
	return digest.String(), nil
}

// writeTree writes the tree under dir to the tar file path, in lexical order, every time set to epoch, no
// user or group names, files that share an inode as hard links: the same tree gives the same bytes.
func writeTree(path, dir string, epoch int64) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	tw := tar.NewWriter(f)
	mtime := time.Unix(epoch, 0)
	links := map[[2]uint64]string{}
	walkErr := walkSorted(dir, func(rel string, info fs.FileInfo) error {
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			var err error
			if target, err = os.Readlink(filepath.Join(dir, rel)); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr.Name = rel
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = mtime, time.Time{}, time.Time{}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			hdr.Devmajor, hdr.Devminor = 0, 0
			if info.Mode().IsRegular() && st.Nlink > 1 {
				key := [2]uint64{st.Dev, st.Ino}
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[key] = rel
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.Open(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		defer src.Close()
		if _, err := io.Copy(tw, src); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
	if walkErr != nil {
		return walkErr
	}
	return tw.Close()
}

// walkSorted calls fn for every entry under dir (not dir itself), parents before children, siblings in byte
// order, with the path relative to dir. Sockets and devices are refused: a layer has no use for them.
func walkSorted(dir string, fn func(rel string, info fs.FileInfo) error) error {
	var walk func(rel string) error
	walk = func(rel string) error {
		entries, err := os.ReadDir(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		for _, n := range names {
			r := filepath.ToSlash(filepath.Join(rel, n))
			info, err := os.Lstat(filepath.Join(dir, r))
			if err != nil {
				return err
			}
			switch m := info.Mode(); {
			case m.IsDir(), m.IsRegular(), m&fs.ModeSymlink != 0:
			default:
				return fmt.Errorf("%s: %v is not a file, directory or symlink: remove it from the layer", r, m.Type())
			}
			if err := fn(r, info); err != nil {
				return err
			}
			if info.IsDir() {
				if err := walk(r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk("")
}
