// Package sandboxinit is the first process of a pooled container: a container created ahead of its call
// (namespaces, mounts, cgroup and seccomp set up, and this init started, blocked on its standard input)
// learns what to run only when a call claims it. Main runs inside that container, as the sandbox user with no capabilities, reads the
// call's Request from its standard input, binds what the runtime could not bind ahead (working directory,
// resource limits, standard input) and then replaces itself with the call's program, which becomes the
// container's pid 1 exactly as in a container created for the call.
//
// The worker's own static binary is the init (its "sandbox-init" sub-command), mounted read-only in every
// pooled container. This package holds both sides of the protocol: Encode for the runtime that claims a
// container, Main for the init. It imports nothing of toolpool's, so that the init stays small.
package sandboxinit

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Command is the sub-command of toolpool-init (cmd/toolpool-init) that runs Main.
const Command = "sandbox-init"

// Path is where the worker mounts toolpool-init in each pooled container.
const Path = "/.toolpool/init"

// magic opens every request, so that a container whose standard input is not the runtime's (a bug) fails
// instead of running garbage.
var magic = [4]byte{'t', 'p', 'i', '1'}

// MaxRequestBytes bounds a request (the kernel's own bound on argv and environment is about the same).
const MaxRequestBytes = 8 << 20

// Exit codes of Main when the call's program did not start. ExitCwd and ExitNoProgram are what a shell
// answers for the same problems, and what a container created for the call answers too.
const (
	// ExitCwd: the working directory does not exist or is not a directory (the message says which).
	ExitCwd = 126
	// ExitNoProgram: the program is not in the container's root filesystem.
	ExitNoProgram = 127
	// ExitFailed: the init could not prepare the process (a broken request, a workspace that is not the
	// one the runtime bound, a limit it could not set). Nothing of the call ran.
	ExitFailed = 125
)

// FileID identifies a directory by device and inode, as stat(2) reports them.
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Request is what a call binds at claim time.
type Request struct {
	// Argv is the call's program and arguments; a program without a slash is looked up in the PATH of Env.
	Argv []string `json:"argv"`
	// Env is the program's whole environment.
	Env []string `json:"env"`
	// Cwd is the absolute working directory, entered by the init itself as the sandbox user.
	Cwd string `json:"cwd"`
	// Stdin says the call's standard input follows the request on the same stream; otherwise the program's
	// standard input is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// NoFile and FileSize, when not zero, lower RLIMIT_NOFILE and RLIMIT_FSIZE (soft and hard) to their
	// value. A limit can only be lowered: a request for more than the container has fails (ExitFailed).
	NoFile   uint64 `json:"nofile,omitempty"`
	FileSize uint64 `json:"fsize,omitempty"`
	// Workspace, when set, is the identity the directory at WorkspacePath must have: the workspace the
	// runtime bound into the container's slot. Anything else (an empty slot, a propagation that did not
	// happen) fails with ExitFailed before the program starts.
	Workspace *FileID `json:"workspace,omitempty"`
	// Nonce tags the init's own failure messages (see FailurePrefix): the call's program never sees the
	// request, so it cannot write a message that the runtime would take for the init's.
	Nonce string `json:"nonce"`
}

// WorkspacePath is where the workspace is mounted in every container.
const WorkspacePath = "/workspace"

// FailurePrefix starts the line that the init writes to standard error when it exits with ExitFailed or
// ExitNoProgram, followed by what failed.
func FailurePrefix(nonce string) string { return "toolpool-init[" + nonce + "]: " }

// Ack is what the init writes to standard error, first and in one write, as soon as it has read its
// request: from then on the process is the call's. A container whose standard error does not begin with it
// ended before it took the call (its init died while it waited), so nothing of the call ran; the runtime
// removes it from the call's output.
func Ack(nonce string) string { return FailurePrefix(nonce) + "request taken\n" }

// Encode returns req framed for the init's standard input.
func Encode(req Request) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode init request: %w", err)
	}
	if len(body) > MaxRequestBytes {
		return nil, fmt.Errorf("encode init request: %d bytes, more than %d", len(body), MaxRequestBytes)
	}
	var b bytes.Buffer
	b.Write(magic[:])
	_ = binary.Write(&b, binary.BigEndian, uint32(len(body)))
	b.Write(body)
	return b.Bytes(), nil
}

// Main is the init: it closes every descriptor but the standard three, reads one request from descriptor
// 0 (exactly its bytes, so that the call's standard input that follows stays unread), checks the
// workspace, lowers the limits, enters the working directory and executes the program. It returns only when
// the program could not be started, with one of the Exit codes, after writing why to stderr.
func Main(stderr io.Writer) int {
	// A descriptor of the host would let a path through /proc/self/fd/N lead out of the container
	// (CVE-2024-21626): none is expected, and none survives the exec of the program. They are marked
	// close-on-exec rather than closed now: the Go runtime of this very process holds descriptors of its
	// own (the netpoller's epoll), and closing those under it crashes the init at its next GC.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		cloexecFrom(3)
	}
	// Until then, the init itself enters the working directory: a directory descriptor reached through a
	// planted /proc/self/fd/N symlink would lead out, so those are closed now (the runtime holds none).
	closeDirsFrom(3)
	req, err := readRequest(fdReader(0))
	if err != nil {
		fmt.Fprintf(stderr, "toolpool-init: %v\n", err)
		return ExitFailed
	}
	if _, err := io.WriteString(stderr, Ack(req.Nonce)); err != nil {
		return ExitFailed
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, FailurePrefix(req.Nonce)+format+"\n", a...)
		return code
	}
	if req.Workspace != nil {
		var st unix.Stat_t
		if err := unix.Lstat(WorkspacePath, &st); err != nil {
			return fail(ExitFailed, "check workspace: %v", err)
		}
		if st.Dev != req.Workspace.Dev || st.Ino != req.Workspace.Ino {
			return fail(ExitFailed, "check workspace: %s is not the workspace bound for this call", WorkspacePath)
		}
	}
	for _, l := range []struct {
		res   int
		value uint64
	}{{unix.RLIMIT_NOFILE, req.NoFile}, {unix.RLIMIT_FSIZE, req.FileSize}} {
		if l.value == 0 {
			continue
		}
		var cur unix.Rlimit
		if err := unix.Getrlimit(l.res, &cur); err != nil {
			return fail(ExitFailed, "read limit %d: %v", l.res, err)
		}
		if l.value > cur.Max {
			return fail(ExitFailed, "limit %d: %d is above the container's %d", l.res, l.value, cur.Max)
		}
		if err := unix.Setrlimit(l.res, &unix.Rlimit{Cur: l.value, Max: l.value}); err != nil {
			return fail(ExitFailed, "lower limit %d: %v", l.res, err)
		}
	}
	if !req.Stdin {
		null, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
		if err != nil {
			return fail(ExitFailed, "open /dev/null: %v", err)
		}
		if err := unix.Dup3(null, 0, 0); err != nil {
			return fail(ExitFailed, "redirect stdin: %v", err)
		}
		_ = unix.Close(null)
	}
	if len(req.Argv) == 0 {
		return fail(ExitFailed, "empty argv")
	}
	// The same words as the cold path's trampoline: the call cannot tell where it ran.
	if err := unix.Chdir(req.Cwd); err != nil {
		fmt.Fprintf(stderr, "toolpool: cannot change to the working directory %s: it does not exist or is not a directory\n", req.Cwd)
		return ExitCwd
	}
	if req.Cwd != WorkspacePath {
		// What the cold path's trampoline (`cd` in sh, then exec) leaves in the environment: the logical
		// working directory, and the one it left.
		req.Env = setEnv(setEnv(req.Env, "OLDPWD", WorkspacePath), "PWD", req.Cwd)
	}
	prog, err := lookPath(req.Argv[0], env(req.Env, "PATH"))
	if errors.Is(err, unix.ENOENT) {
		return fail(ExitNoProgram, "exec %s: %v", req.Argv[0], err)
	}
	if err != nil {
		return fail(ExitFailed, "exec %s: %v", req.Argv[0], err)
	}
	err = unix.Exec(prog, req.Argv, req.Env)
	if errors.Is(err, unix.ENOENT) {
		return fail(ExitNoProgram, "exec %s: %v", req.Argv[0], err)
	}
	return fail(ExitFailed, "exec %s: %v", req.Argv[0], err)
}

// readRequest reads one framed request from r, and not a byte more.
func readRequest(r io.Reader) (Request, error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return Request{}, fmt.Errorf("read request: %w", err)
	}
	if !bytes.Equal(head[:4], magic[:]) {
		return Request{}, errors.New("read request: not a toolpool init request")
	}
	n := binary.BigEndian.Uint32(head[4:])
	if n > MaxRequestBytes {
		return Request{}, fmt.Errorf("read request: %d bytes, more than %d", n, MaxRequestBytes)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Request{}, fmt.Errorf("read request: %w", err)
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		return Request{}, fmt.Errorf("decode request: %w", err)
	}
	return req, nil
}

// fdReader reads a descriptor with plain read(2): no buffering and no poller, so exactly the bytes asked
// for are consumed.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(f), p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// closeDirsFrom closes every descriptor from fd up that refers to a directory.
func closeDirsFrom(fd int) {
	for i, top := fd, descriptorTop(); i < top; i++ {
		var st unix.Stat_t
		if unix.Fstat(i, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			_ = unix.Close(i)
		}
	}
}

// descriptorTop is one past the highest descriptor the init looks at: the open-files limit, at most 4096.
func descriptorTop() int {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur < 4096 {
		return int(lim.Cur)
	}
	return 4096
}

// cloexecFrom marks every descriptor from fd up close-on-exec, for kernels without
// close_range(2)'s CLOSE_RANGE_CLOEXEC (5.11).
func cloexecFrom(fd int) {
	for i, top := fd, descriptorTop(); i < top; i++ {
		_, _ = unix.FcntlInt(uintptr(i), unix.F_SETFD, unix.FD_CLOEXEC)
	}
}

// setEnv returns list with key set to value (every earlier entry of key removed).
func setEnv(list []string, key, value string) []string {
	out := make([]string, 0, len(list)+1)
	for _, kv := range list {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}

func env(list []string, key string) string {
	for i := len(list) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(list[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds file in the directories of path, like execvp(3): a name with a slash is used as it is.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, executable(file)
	}
	var denied error
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		err := executable(p)
		if err == nil {
			return p, nil
		}
		if errors.Is(err, unix.EACCES) {
			denied = err
		}
	}
	if denied != nil {
		return "", denied
	}
	return "", syscall.ENOENT
}

func executable(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EACCES
	}
	return unix.Access(p, unix.X_OK)
}
