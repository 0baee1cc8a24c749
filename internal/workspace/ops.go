package workspace

import "strings"

// Workspace operations travel as calls (the dispatcher decides, records, audits and queues them; a worker
// runs them with a Manager): the tool of such a call is one of Ops, which is also its policy kind.

// The workspace operations, each its own tool name and policy kind.
const (
	OpCreate   = "workspace_create"
	OpClone    = "workspace_clone" // create from a git repository (Args.Git), fetched through the egress path
	OpList     = "workspace_list"
	OpInfo     = "workspace_info"
	OpUpload   = "workspace_upload"
	OpReadFile = "workspace_read_file"
	OpArchive  = "workspace_archive"
	OpSnapshot = "workspace_snapshot"
	OpFork     = "workspace_fork"
	OpRestore  = "workspace_restore"
	OpDelete   = "workspace_delete"
	// OpSetImage changes the default image of an existing workspace (Args.Image; "" for none).
	OpSetImage = "workspace_set_image"
)

// Ops lists the workspace operations.
var Ops = []string{OpCreate, OpClone, OpList, OpInfo, OpUpload, OpReadFile, OpArchive, OpSnapshot, OpFork, OpRestore, OpDelete, OpSetImage}

// IsOp reports whether tool is a workspace operation.
func IsOp(tool string) bool { return strings.HasPrefix(tool, "workspace_") }

// Args are a workspace operation's arguments.
type Args struct {
	// Path is a directory (upload destination, archive root) or a file (read) inside the workspace.
	Path string `json:"path,omitempty"`
	// Archive names the uploaded tar, tar.gz or zip in the output store (create, upload).
	Archive string `json:"archive,omitempty"`
	// Snapshot names a snapshot (snapshot, restore; fork from it when set).
	Snapshot string `json:"snapshot,omitempty"`
	// Git is the repository a clone seeds the new workspace from.
	Git *Git `json:"git,omitempty"`
	// Image is the default image of the workspace a create or clone makes, or that a set_image gives an
	// existing one ("" for none) (Manager.SetImage), as the dispatcher admitted it.
	Image string `json:"image,omitempty"`
	// To names the new workspace of a fork.
	To string `json:"to,omitempty"`
	// Offset and Length select bytes of a file read; Length < 0 reads to the end; Offset < 0 reads the last -Offset bytes.
	Offset int64 `json:"offset,omitempty"`
	Length int64 `json:"length,omitempty"`
}

// Output is a workspace operation's result, JSON in the call's output.
type Output struct {
	Workspace  *Info  `json:"workspace,omitempty"`
	Workspaces []Info `json:"workspaces,omitempty"`
	// Object names what a read or archive stored in the output store, of ObjectBytes bytes; for a file,
	// FileBytes is its whole size and Offset where the object starts in it.
	Object      string `json:"object,omitempty"`
	ObjectBytes int64  `json:"object_bytes,omitempty"`
	FileBytes   int64  `json:"file_bytes,omitempty"`
	Offset      int64  `json:"offset,omitempty"`
}
