package worker

import (
	"fmt"
	"os"
	"path"

	"github.com/toolpool/toolpool/internal/call"
)

// prepareWorkspace creates WorkspacesDir/<tenant>/<workspace> for the sandbox user and returns it. It
// resolves every component beneath WorkspacesDir, never following a symlink out of it.
func (w *Worker) prepareWorkspace(tenant, workspace string) (string, error) {
	if err := call.ValidateName("tenant", tenant); err != nil {
		return "", fmt.Errorf("prepare workspace: %w", err)
	}
	if err := call.ValidateName("workspace", workspace); err != nil {
		return "", fmt.Errorf("prepare workspace: %w", err)
	}
	root, err := os.OpenRoot(w.cfg.WorkspacesDir)
	if err != nil {
		return "", fmt.Errorf("open workspaces dir: %w", err)
	}
	defer root.Close()
	rel := tenant + "/" + workspace
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return "", fmt.Errorf("create workspace %s: %w", rel, err)
	}
	fi, err := root.Lstat(rel)
	if err != nil {
		return "", fmt.Errorf("stat workspace %s: %w", rel, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("prepare workspace %s: not a directory", rel)
	}
	if os.Geteuid() == 0 {
		f, err := root.Open(rel)
		if err != nil {
			return "", fmt.Errorf("open workspace %s: %w", rel, err)
		}
		err = f.Chown(w.cfg.UID, w.cfg.GID) // on the open descriptor: no path to race
		f.Close()
		if err != nil {
			return "", fmt.Errorf("chown workspace %s: %w", rel, err)
		}
	}
	return path.Join(w.cfg.WorkspacesDir, rel), nil
}
