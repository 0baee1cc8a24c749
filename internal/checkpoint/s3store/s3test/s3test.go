// Package s3test starts a real S3 server for tests: versitygw (its posix backend, on a test's temporary
// directory) on a free loopback port, with a bucket made through the S3 API. It is imported by tests only.
// versitygw is found on PATH or at $VERSITYGW (scripts/deps.sh builds it); without it a test is skipped,
// or fails under CI=true, where a green run without the S3 tests would prove nothing.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint/s3store"
	"github.com/toolpool/toolpool/internal/testproc"
)

// Binary returns the versitygw binary's path, skipping (or, under CI=true, failing) t when there is none.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p
	}
	p, err := exec.LookPath("versitygw")
	if err != nil {
		msg := "this test needs versitygw, a real S3 server: run scripts/deps.sh (or go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// Server starts versitygw and returns a Config for a fresh bucket on it; it stops when t ends.
func Server(t testing.TB) s3store.Config {
	t.Helper()
	bin := Binary(t)
	root := filepath.Join(t.TempDir(), "s3")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	key, secret := random(8), random(16)
	var cfg s3store.Config
	// A port that was free a moment ago may be taken by the time the server listens: try a few.
	for attempt := 0; ; attempt++ {
		addr := testproc.FreeAddr(t)
		cmd := exec.Command(bin, "--access", key, "--secret", secret, "--port", addr, "posix", root)
		log, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatalf("start versitygw: %v", err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		stop := func() {
			cmd.Process.Kill()
			<-done
			log.Close()
		}
		cfg = s3store.Config{Endpoint: "http://" + addr, Bucket: "checkpoints", AccessKeyID: key, SecretAccessKey: secret}
		if up(addr, done) {
			t.Cleanup(stop)
			break
		}
		stop()
		if attempt == 4 {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("versitygw did not start: %s", b)
		}
	}
	s, err := s3store.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.CreateBucket(ctx); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// up waits up to 30 s for the server at addr to answer, or for it to exit (false).
func up(addr string, exited <-chan struct{}) bool {
	deadline := time.Now().Add(30 * time.Second)
	for wait := 10 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 200*time.Millisecond) {
		select {
		case <-exited:
			return false
		case <-time.After(wait):
		}
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			return true
		}
	}
	return false
}

func random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("read random: %v", err))
	}
	return hex.EncodeToString(b)
}
