package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostSystemDirs are the host directories a host-view root filesystem shows, read-only. A host entry that is
// a symlink (merged /usr: /bin -> usr/bin) is reproduced as the same symlink instead.
var hostSystemDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// hostEtcEntries are the parts of the host's /etc that hold no secrets and that programs need: the
// alternatives links (awk, editor), CA certificates and the loader cache.
var hostEtcEntries = []string{"alternatives", "ssl/certs", "ld.so.cache", "localtime"}

// Paths inside the container that the runtime mounts over; they must exist in the read-only root.
const (
	workspaceDir = "/workspace"
	toolpoolDir  = "/.toolpool"
)

// hostRootFS is a prepared read-only root: an otherwise empty directory with a synthesized /etc and the
// mount points for the host's system directories.
type hostRootFS struct {
	path   string
	mounts []specs.Mount
}

// prepareHostRootFS builds the root under dir (replacing what an earlier worker left there) for a sandbox
// user uid:gid. It returns the root and the bind mounts that give it the host's system directories.
func prepareHostRootFS(dir string, uid, gid uint32) (*hostRootFS, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove old rootfs %s: %w", dir, err)
	}
	r := &hostRootFS{path: dir}
	for _, d := range []string{"", "etc", "proc", "dev", "sys", "tmp", "run", "workspace", ".toolpool"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("create rootfs dir: %w", err)
		}
	}
	// runc gives a tmpfs the mode of the directory it covers.
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o777|os.ModeSticky); err != nil {
		return nil, fmt.Errorf("chmod rootfs tmp: %w", err)
	}
	for _, name := range hostSystemDirs {
		host := "/" + name
		fi, err := os.Lstat(host)
		if err != nil {
			continue // absent on this host (lib32 on most)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(host)
			if err != nil {
				return nil, fmt.Errorf("read link %s: %w", host, err)
			}
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("create rootfs link %s: %w", name, err)
			}
			continue
		}
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			return nil, fmt.Errorf("create rootfs dir %s: %w", name, err)
		}
		r.mounts = append(r.mounts, roBind(host, host))
	}
	for _, name := range hostEtcEntries {
		host := "/etc/" + name
		fi, err := os.Stat(host)
		if err != nil {
			continue
		}
		target := filepath.Join(dir, "etc", name)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return nil, fmt.Errorf("create rootfs etc dir: %w", err)
		}
		if fi.IsDir() {
			err = os.Mkdir(target, 0o755)
		} else {
			err = os.WriteFile(target, nil, 0o644)
		}
		if err != nil {
			return nil, fmt.Errorf("create mount point %s: %w", target, err)
		}
		r.mounts = append(r.mounts, roBind(host, host))
	}
	// Mount points for the CA bundles of calls with trusted CAs (trust.go).
	for _, p := range []string{caBundlePath, caExtraPath} {
		if err := ensureMountPoint(dir, p, false); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"passwd":        fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:%d:%d:toolpool sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, gid),
		"group":         fmt.Sprintf("root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n", gid),
		"hosts":         "127.0.0.1\tlocalhost toolpool\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":      "toolpool\n",
		"resolv.conf":   "# toolpool sandboxes have no DNS: web access goes through the egress proxy (HTTP_PROXY, when policy grants network) or the web_fetch tool\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
		"os-release":    "NAME=toolpool-sandbox\nID=toolpool\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("write rootfs etc/%s: %w", name, err)
		}
	}
	return r, nil
}

// ensureMountPoint creates an empty file or directory at the container path p under root, so that a bind
// mount onto a read-only root has a place to land.
func ensureMountPoint(root, p string, dir bool) error {
	target := filepath.Join(root, filepath.Clean("/"+p))
	if !strings.HasPrefix(target, root+string(filepath.Separator)) {
		return fmt.Errorf("create mount point %s: outside the root", p)
	}
	if _, err := os.Lstat(target); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("create mount point %s: %w", p, err)
	}
	if dir {
		return os.Mkdir(target, 0o755)
	}
	return os.WriteFile(target, nil, 0o644)
}

func roBind(src, dst string) specs.Mount {
	return specs.Mount{Type: "bind", Source: src, Destination: dst, Options: []string{"bind", "ro", "nosuid", "nodev"}}
}
