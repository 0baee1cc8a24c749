package executor

import (
	"errors"
	"fmt"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/tools"
)

// maxHidden is the most paths under denied globs a workspace may hold for a call that hides them: each is
// a mount of its own in the call's container.
const maxHidden = 1000

// hiddenPaths returns the paths of the workspace at dir that call c's container must not see: those its
// denied globs match (call.Limits.DeniedGlobs), for the tools that do not apply the globs themselves
// (run_shell, custom tools; the built-in file tools check each path they open, in their runner). A
// workspace with more than maxHidden of them is the caller's error to fix. The executor's Finder keeps the
// readings of directories that did not change, so that a large workspace is not read whole for each call.
func (e *Executor) hiddenPaths(c *call.Call, tool *tools.Tool, dir string) ([]string, *call.ErrorInfo, error) {
	if tool.TakesDeniedGlobs() || len(c.Limits.DeniedGlobs) == 0 {
		return nil, nil, nil
	}
	set, err := deniedpath.Compile(c.Limits.DeniedGlobs)
	if err != nil {
		return nil, &call.ErrorInfo{Type: call.ErrInvalidParams, Message: fmt.Sprintf("the call's denied globs do not compile: %v", err)}, nil
	}
	hidden, err := e.finder.Find(set, dir, maxHidden)
	if errors.Is(err, deniedpath.ErrTooMany) {
		return nil, &call.ErrorInfo{Type: call.ErrPermissionDenied, Message: fmt.Sprintf("toolpool did not run this call: "+
			"the workspace holds more than %d files or directories under the denied globs (%v), and each must be hidden from "+
			"the call's container. Remove them from the workspace, or keep them in fewer directories (a denied "+
			"directory counts once).", maxHidden, err)}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return hidden, nil, nil
}
