// Command probe is the escape suite's hands inside a container: each subcommand makes one raw attempt at
// something a sandboxed call must not be able to do and prints what the kernel answered ("OK" or the errno
// name, such as EPERM), so that the test asserts on the kernel's own answer rather than on a shell's
// interpretation of it. It is built static (CGO_ENABLED=0) by the tests and bind-mounted read-only.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == sandboxinit.Command {
		// The escape suite's warm pool runs the probe as its containers' init, so that a call that mounts
		// the probe still uses the pool.
		os.Exit(sandboxinit.Main(os.Stderr))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe COMMAND [ARGS]")
		os.Exit(2)
	}
	args := os.Args[2:]
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		fmt.Fprintf(os.Stderr, "probe %s: missing argument %d\n", os.Args[1], i+1)
		os.Exit(2)
		return ""
	}
	switch os.Args[1] {
	case "io_uring_setup":
		var params [120]byte // struct io_uring_params
		_, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 8, uintptr(unsafe.Pointer(&params)), 0)
		report(e)
	case "keyctl":
		// Join (create) a new session keyring: the cheapest keyring operation there is.
		_, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0)
		report(e)
	case "add_key":
		typ, desc, payload := []byte("user\x00"), []byte("toolpool\x00"), []byte("x")
		keyring := unix.KEY_SPEC_PROCESS_KEYRING
		_, _, e := unix.Syscall6(unix.SYS_ADD_KEY, uintptr(unsafe.Pointer(&typ[0])), uintptr(unsafe.Pointer(&desc[0])),
			uintptr(unsafe.Pointer(&payload[0])), 1, uintptr(keyring), 0)
		report(e)
	case "unshare":
		flags := map[string]int{"user": unix.CLONE_NEWUSER, "mnt": unix.CLONE_NEWNS, "net": unix.CLONE_NEWNET, "pid": unix.CLONE_NEWPID}
		f, ok := flags[arg(0)]
		if !ok {
			fmt.Fprintln(os.Stderr, "probe unshare: user, mnt, net or pid")
			os.Exit(2)
		}
		_, _, e := unix.RawSyscall(unix.SYS_UNSHARE, uintptr(f), 0, 0)
		report(e)
	case "clone_newuser":
		// A child in a new user namespace, the way any program (or exploit) would ask for one: Go tries
		// clone3 and falls back to clone.
		cmd := exec.Command("/proc/self/exe", "whoami")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		report(cmd.Run())
	case "mount":
		report(unix.Mount("none", arg(0), "tmpfs", 0, ""))
	case "bind_mount":
		report(unix.Mount(arg(0), arg(1), "", unix.MS_BIND, ""))
	case "chroot":
		report(unix.Chroot(arg(0)))
	case "ptrace_attach":
		pid, _ := strconv.Atoi(arg(0))
		report(unix.PtraceAttach(pid))
	case "kill0":
		pid, _ := strconv.Atoi(arg(0))
		report(unix.Kill(pid, 0))
	case "socket":
		families := map[string]int{"packet": unix.AF_PACKET, "inet": unix.AF_INET, "vsock": unix.AF_VSOCK, "netlink": unix.AF_NETLINK}
		types := map[string]int{"raw": unix.SOCK_RAW, "stream": unix.SOCK_STREAM, "dgram": unix.SOCK_DGRAM}
		proto, _ := strconv.Atoi(arg(2))
		family, ok := families[arg(0)]
		if !ok {
			family, _ = strconv.Atoi(arg(0)) // a number: AF_TIPC is 30
		}
		fd, err := unix.Socket(family, types[arg(1)], proto)
		if err == nil {
			unix.Close(fd)
		}
		report(err)
	case "connect":
		c, err := net.DialTimeout("tcp", arg(0), 2*time.Second)
		if err == nil {
			c.Close()
		}
		report(err)
	case "connect_unix":
		c, err := net.DialTimeout("unix", arg(0), 2*time.Second)
		if err == nil {
			c.Close()
		}
		report(err)
	case "open_read":
		f, err := os.Open(arg(0))
		if err == nil {
			var b [1]byte
			if _, err = f.Read(b[:]); errors.Is(err, io.EOF) {
				err = nil
			}
			f.Close()
		}
		report(err)
	case "open_write":
		f, err := os.OpenFile(arg(0), os.O_WRONLY, 0)
		if err == nil {
			_, err = f.Write([]byte("1"))
			f.Close()
		}
		report(err)
	case "mknod":
		report(unix.Mknod(arg(0), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	case "perf_event_open":
		var attr unix.PerfEventAttr
		attr.Type = unix.PERF_TYPE_SOFTWARE
		attr.Config = unix.PERF_COUNT_SW_CPU_CLOCK
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		report(err)
	case "bpf":
		var attr [128]byte
		_, _, e := unix.Syscall(unix.SYS_BPF, 5 /* BPF_PROG_LOAD */, uintptr(unsafe.Pointer(&attr)), uintptr(len(attr)))
		report(e)
	case "userfaultfd":
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		report(e)
	case "x32_getpid":
		// getpid through the x32 ABI (the syscall number with bit 30 set), on amd64, on a thread of its own:
		// a seccomp filter that kills the calling thread leaves the rest of the program running, and the
		// thread's disappearance from /proc/self/task is the answer (KILLED), with no timeout to guess.
		// The main goroutine keeps the main thread, so the attempt runs on another: a killed main thread
		// stays in /proc/self/task, as a zombie, until the whole process exits.
		runtime.LockOSThread()
		tids := make(chan int, 1)
		answers := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: a thread that survives the call is not reused
			tids <- unix.Gettid()
			// Syscall, not RawSyscall: the runtime must know this goroutine is in a system call, or a
			// garbage collection would wait forever for a thread that no longer exists.
			_, _, e := unix.Syscall(0x40000000|39, 0, 0, 0)
			answers <- e
		}()
		task := fmt.Sprintf("/proc/self/task/%d", <-tids)
		for {
			select {
			case e := <-answers:
				report(e)
				return
			case <-time.After(10 * time.Millisecond):
			}
			if stat, err := os.ReadFile(task + "/stat"); errors.Is(err, os.ErrNotExist) || threadDead(string(stat)) {
				fmt.Println("KILLED")
				return
			}
		}
	case "setuid0":
		report(unix.Setuid(0))
	case "whoami":
		status, _ := os.ReadFile("/proc/self/status")
		var capEff string
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "CapEff:") {
				capEff = strings.TrimSpace(strings.TrimPrefix(l, "CapEff:"))
			}
		}
		fmt.Printf("uid=%d euid=%d gid=%d egid=%d capeff=%s\n", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid(), capEff)
	case "alloc":
		// Allocate and touch MiB of memory one MiB at a time, printing progress, then hold it.
		mib, _ := strconv.Atoi(arg(0))
		var keep [][]byte
		for i := range mib {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = byte(i)
			}
			keep = append(keep, b)
			if i%64 == 0 {
				fmt.Println("allocated", i, "MiB")
			}
		}
		fmt.Println("allocated all", len(keep), "MiB")
	case "fds":
		// Open files until the kernel refuses and report how many and why.
		n := 0
		var err error
		for {
			var fd int
			fd, err = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				break
			}
			_ = fd
			n++
		}
		fmt.Printf("opened %d: ", n)
		report(err)
	case "fork_until_refused":
		// Start children that sleep until one is refused; report how many and why.
		n := 0
		var err error
		for n < 100000 {
			cmd := exec.Command("/bin/sleep", "60")
			if err = cmd.Start(); err != nil {
				break
			}
			n++
		}
		fmt.Printf("started %d: ", n)
		report(err)
	case "sleep":
		s, _ := strconv.Atoi(arg(0))
		time.Sleep(time.Duration(s) * time.Second)
	case "mark_sleep":
		// Write a marker file (the call is running), then sleep.
		if err := os.WriteFile(arg(0), []byte("started\n"), 0o644); err != nil {
			report(err)
			os.Exit(1)
		}
		s, _ := strconv.Atoi(arg(1))
		time.Sleep(time.Duration(s) * time.Second)
	case "mark_wait":
		// Write a marker file (the call is running), then wait until the release file exists.
		if err := os.WriteFile(arg(0), []byte("started\n"), 0o644); err != nil {
			report(err)
			os.Exit(1)
		}
		for {
			if _, err := os.Stat(arg(1)); err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

// threadDead reports whether a /proc/PID/task/TID/stat line says the thread has exited (zombie or dead).
func threadDead(stat string) bool {
	i := strings.LastIndexByte(stat, ')') // the state follows the command name in parentheses
	return i >= 0 && (strings.HasPrefix(stat[i:], ") Z") || strings.HasPrefix(stat[i:], ") X"))
}

// report prints OK for success or the errno's name.
func report(e error) {
	if e == nil || e == syscall.Errno(0) {
		fmt.Println("OK")
		return
	}
	var errno syscall.Errno
	if errors.As(e, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			fmt.Println(name)
			return
		}
	}
	fmt.Println("ERROR", e)
}
