package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The sandbox stops, with status 0, on SIGTERM and on SIGINT, as the kubelet's StopPodSandbox expects, and
// keeps running through SIGCHLD.
func TestStopsOnTermAndInt(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pause")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Wait until its handler is installed (SigCgt has SIGTERM), then SIGCHLD must not stop it.
		deadline := time.Now().Add(10 * time.Second)
		for !caught(t, cmd.Process.Pid) {
			if time.Now().After(deadline) {
				t.Fatal("no signal handler after 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGCHLD); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("exited on SIGCHLD: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%v: exit %v, want 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("%v: still running after 10s", sig)
		}
	}
}

// caught reports whether process pid catches SIGTERM (/proc/PID/status, SigCgt).
func caught(t *testing.T, pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return mask&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}
	return false
}
