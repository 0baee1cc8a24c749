package containerd

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/containerd/containerd/archive/compression"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// checkLayers reads every layer of the image target (for this machine's platform) from the content store
// and refuses one that holds what no sandbox root may: a device node, an entry with an absolute path or a
// ".." component, a hard link to such a path, or a symbolic link whose relative target climbs out of the
// root. containerd's unpacker already keeps every entry inside the snapshot; this check makes such a layer
// an error the image's owner can fix, instead of something silently rewritten. Absolute symbolic links are
// allowed: they resolve inside the container's own root.
func checkLayers(ctx context.Context, cs content.Store, target ocispec.Descriptor) error {
	m, err := images.Manifest(ctx, cs, target, platforms.Default())
	if err != nil {
		return fmt.Errorf("read manifest: %w", err)
	}
	for i, l := range m.Layers {
		if err := checkLayer(ctx, cs, l); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err)
		}
	}
	return nil
}

func checkLayer(ctx context.Context, cs content.Store, desc ocispec.Descriptor) error {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer ra.Close()
	ds, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		return fmt.Errorf("decompress: %w", err)
	}
	defer ds.Close()
	tr := tar.NewReader(ds)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := checkEntry(h); err != nil {
			return err
		}
	}
}

// checkEntry refuses one hostile layer entry, saying which and why.
func checkEntry(h *tar.Header) error {
	if err := checkLayerPath(h.Name); err != nil {
		return fmt.Errorf("entry %q: %w", h.Name, err)
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("entry %q is a device node (%d:%d): images may not carry device nodes; the sandbox provides /dev", h.Name, h.Devmajor, h.Devminor)
	case tar.TypeLink:
		if err := checkLayerPath(h.Linkname); err != nil {
			return fmt.Errorf("hard link %q to %q: %w", h.Name, h.Linkname, err)
		}
	case tar.TypeSymlink:
		if !path.IsAbs(h.Linkname) {
			dest := path.Join(path.Dir(path.Clean("/"+h.Name)), h.Linkname)
			if escapes(path.Dir(path.Clean("/"+h.Name)), h.Linkname) {
				return fmt.Errorf("symbolic link %q to %q leads out of the image's root (to %s)", h.Name, h.Linkname, dest)
			}
		}
	}
	return nil
}

// checkLayerPath refuses an entry path that is absolute or has a ".." component.
func checkLayerPath(p string) error {
	if path.IsAbs(p) {
		return errors.New("absolute path: layer entries must be relative to the image's root")
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return errors.New(`".." in the path: layer entries must stay inside the image's root`)
		}
	}
	return nil
}

// escapes reports whether a relative link target, followed from directory dir (absolute, clean), goes above
// the root at any step.
func escapes(dir, target string) bool {
	depth := len(strings.Split(strings.Trim(dir, "/"), "/"))
	if dir == "/" {
		depth = 0
	}
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}
