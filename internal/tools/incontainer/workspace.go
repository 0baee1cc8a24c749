package incontainer

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
)

// binarySniffBytes is how much of a file the binary heuristic reads.
const binarySniffBytes = 8 << 10

// ignoredDirs are skipped by list_files, glob and grep unless asked for: version control, dependency and
// cache directories a model rarely means to read.
var ignoredDirs = map[string]bool{
	".git": true, ".hg": true, ".svn": true, "node_modules": true, "__pycache__": true, ".venv": true,
	"venv": true, ".mypy_cache": true, ".pytest_cache": true, ".ruff_cache": true, ".tox": true,
	".gradle": true, ".next": true, ".terraform": true, ".idea": true, ".cache": true,
}

// resolve turns the path argument arg (value p) into a path for e.root, or an invalid_params error.
func (e *runEnv) resolve(arg, p string) (string, error) {
	rel, err := RelPath(p)
	if err != nil {
		return "", toolErr(call.ErrInvalidParams, "%s %s", arg, err.Error())
	}
	return rel, nil
}

// pathErr turns an error from an os.Root method on rel into a message for the model.
func pathErr(err error, verb, rel string) error {
	var te *toolError
	if errors.As(err, &te) {
		return err
	}
	shown := showPath(rel)
	switch {
	case isEscape(err):
		return toolErr(call.ErrPermissionDenied, "%s %s: the path leads outside the workspace (through a symlink or \"..\"): only files under %s can be reached", verb, shown, WorkspaceDir)
	case errors.Is(err, fs.ErrNotExist):
		return toolErr(call.ErrNotFound, "%s %s: no such file or directory in the workspace: check the path with list_files or glob", verb, shown)
	case errors.Is(err, syscall.ENOTDIR):
		return toolErr(call.ErrNotFound, "%s %s: a parent of the path is a file, not a directory", verb, shown)
	case errors.Is(err, fs.ErrPermission):
		return toolErr(call.ErrPermissionDenied, "%s %s: permission denied", verb, shown)
	case errors.Is(err, syscall.ELOOP):
		return toolErr(call.ErrInvalidParams, "%s %s: too many levels of symbolic links", verb, shown)
	}
	return fmt.Errorf("%s %s: %w", verb, shown, err)
}

// isEscape reports whether err is os.Root refusing a path that leaves the root. The os package does not
// export that error, so its text is matched.
func isEscape(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

// showPath renders a workspace-relative path for a message.
func showPath(rel string) string {
	if rel == "." || rel == "" {
		return WorkspaceDir
	}
	return rel
}

// looksBinary reports whether sample (a file's first bytes) is binary: it has a NUL byte, or more than one
// byte in ten is not valid UTF-8 (a sequence cut at the end of sample is not counted).
func looksBinary(sample []byte) bool {
	if len(sample) == 0 {
		return false
	}
	if strings.IndexByte(string(sample), 0) >= 0 {
		return true
	}
	bad := 0
	for i := 0; i < len(sample); {
		r, size := utf8.DecodeRune(sample[i:])
		if r == utf8.RuneError && size == 1 {
			if len(sample)-i < utf8.UTFMax && !utf8.FullRune(sample[i:]) {
				break
			}
			bad++
		}
		i += size
	}
	return bad*10 > len(sample)
}

// kindOf names a file mode for listings.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "file"
	}
	return "other"
}

// RelPath turns a path argument into a cleaned path relative to the workspace ("." for the workspace
// itself). It refuses absolute paths outside WorkspaceDir and paths whose ".." climbs out.
func RelPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("contains a NUL byte")
	}
	if p == "" {
		return ".", nil
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		if c != WorkspaceDir && !strings.HasPrefix(c, WorkspaceDir+"/") {
			return "", fmt.Errorf("is %q, outside the workspace: use a path relative to %s or under %s/", p, WorkspaceDir, WorkspaceDir)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(c, WorkspaceDir), "/")
		if rel == "" {
			return ".", nil
		}
		return rel, nil
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("is %q, which climbs out of the workspace with \"..\": use a path inside %s", p, WorkspaceDir)
	}
	return c, nil
}
