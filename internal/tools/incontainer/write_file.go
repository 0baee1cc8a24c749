package incontainer

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/toolpool/toolpool/internal/call"
)

// newFileMode is the mode of a file write_file or edit_file creates.
const newFileMode fs.FileMode = 0o644

type writeFileArgs struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
}

func runWriteFile(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a writeFileArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	if a.Content == nil {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "argument \"content\" is required: give the file's complete content (\"\" for an empty file)")
	}
	rel, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	if rel == "." {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "write %s: it is the workspace directory: give a file path", WorkspaceDir)
	}
	old, err := e.root.Stat(rel)
	switch {
	case err == nil && old.IsDir():
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "write %s: it is a directory: give a file path", showPath(rel))
	case err == nil && !old.Mode().IsRegular():
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "write %s: it is not a regular file (%s)", showPath(rel), old.Mode().Type())
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return RunnerResult{}, pathErr(err, "write", rel)
	}
	created := err != nil
	if created {
		if dir := path.Dir(rel); dir != "." {
			if err := e.root.MkdirAll(dir, 0o755); err != nil {
				return RunnerResult{}, pathErr(err, "create directory", dir)
			}
		}
	}
	if err := e.writeAtomic(rel, []byte(*a.Content)); err != nil {
		return RunnerResult{}, err
	}
	if created {
		return RunnerResult{Output: fmt.Sprintf("Created %s (%d bytes).", showPath(rel), len(*a.Content))}, nil
	}
	return RunnerResult{Output: fmt.Sprintf("Overwrote %s (%d bytes; it had %d bytes).", showPath(rel), len(*a.Content), old.Size())}, nil
}

// writeAtomic replaces (or creates) the regular file rel with data: it writes a temporary file in the same
// directory, syncs it, gives it the mode of the file it replaces (newFileMode for a new file) and renames it
// into place, so a reader sees the old or the new content, never a mix. When rel is a symlink (inside the
// workspace), the file it points to is rewritten in place instead, keeping the link.
// A file that is, after links, at a denied path is refused before anything is written to it.
func (e *runEnv) writeAtomic(rel string, data []byte) (retErr error) {
	root := e.root
	mode := newFileMode
	if li, err := root.Lstat(rel); err == nil {
		if li.Mode()&fs.ModeSymlink != 0 {
			return e.writeThrough(rel, data)
		}
		mode = li.Mode().Perm()
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("write %s: make a temporary name: %w", rel, err)
	}
	tmp := path.Join(path.Dir(rel), "."+path.Base(rel)+".toolpool-"+hex.EncodeToString(rnd[:])+".tmp")
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return pathErr(err, "write", rel)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if e.denied != nil {
		// The file lands where the temporary file is, whatever links the directories are.
		real, err := e.realPath(f)
		if err != nil {
			return toolErr(call.ErrPermissionDenied, "write %s: policy cannot tell where the path leads (%v), so it is refused", showPath(rel), err)
		}
		if err := e.deniedAt(path.Join(path.Dir(real), path.Base(rel)), "write", rel); err != nil {
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", rel, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", rel, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: set mode: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", rel, err)
	}
	if err := root.Rename(tmp, rel); err != nil {
		return pathErr(err, "write", rel)
	}
	return nil
}

// writeThrough rewrites the file at rel in place (rel is a symlink; os.Root keeps it inside the
// workspace). It truncates only after checking where the link leads.
func (e *runEnv) writeThrough(rel string, data []byte) error {
	f, err := e.root.OpenFile(rel, os.O_WRONLY, 0)
	if err != nil {
		return pathErr(err, "write", rel)
	}
	if err := e.guard(f, "write", rel); err != nil {
		f.Close()
		return err
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return fmt.Errorf("write %s: truncate: %w", rel, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", rel, err)
	}
	return nil
}
