package s3store_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint/s3store"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store/s3test"
)

// TestAgainstRealS3: objects stored, read back, looked up and missing, against versitygw; names with
// characters that the signature must escape; and the answers Check gives for a wrong secret and a
// missing bucket, which say what to fix.
func TestAgainstRealS3(t *testing.T) {
	cfg := s3test.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Prefix = "pool-1/"
	s, err := s3store.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"acme/chunks/0123abcd", "acme/heads/my.workspace_1-x", "odd/name with space+plus=eq"} {
		if has, err := s.Has(ctx, name); err != nil || has {
			t.Fatalf("Has(%q) before Put: %v, %v", name, has, err)
		}
		if _, err := s.Open(ctx, name); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Open(%q) before Put: %v; want os.ErrNotExist", name, err)
		}
		for _, body := range []string{"first " + name, "second " + name} {
			if err := s.Put(ctx, name, strings.NewReader(body)); err != nil {
				t.Fatal(err)
			}
			rc, err := s.Open(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(got) != body {
				t.Fatalf("Open(%q) = %q, %v; want %q", name, got, err, body)
			}
		}
		if has, err := s.Has(ctx, name); err != nil || !has {
			t.Fatalf("Has(%q) after Put: %v, %v", name, has, err)
		}
	}
	if err := s.Put(ctx, "empty", strings.NewReader("")); err != nil {
		t.Fatalf("put an empty object: %v", err)
	}

	// Stat, List and Delete: what garbage collection uses.
	before := time.Now().Add(-time.Minute)
	if size, mod, ok, err := s.Stat(ctx, "acme/chunks/0123abcd"); err != nil || !ok || size != int64(len("second acme/chunks/0123abcd")) || mod.Before(before) || mod.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Stat = %d, %s, %v, %v; want the object's size and a time of now", size, mod, ok, err)
	}
	if _, _, ok, err := s.Stat(ctx, "acme/chunks/missing"); err != nil || ok {
		t.Fatalf("Stat of a missing object: %v, %v", ok, err)
	}
	listed := map[string]int64{}
	err = s.List(ctx, "acme/", func(name string, size int64, mod time.Time) error {
		if mod.Before(before) {
			t.Errorf("listed %s modified at %s", name, mod)
		}
		listed[name] = size
		return nil
	})
	if err != nil || len(listed) != 2 || listed["acme/chunks/0123abcd"] != int64(len("second acme/chunks/0123abcd")) || listed["acme/heads/my.workspace_1-x"] == 0 {
		t.Fatalf("List(acme/) = %v, %v; want acme's two objects, named without the store's prefix", listed, err)
	}
	for range 2 { // deleting what is gone is not an error
		if err := s.Delete(ctx, "acme/chunks/0123abcd"); err != nil {
			t.Fatal(err)
		}
	}
	if has, err := s.Has(ctx, "acme/chunks/0123abcd"); err != nil || has {
		t.Fatalf("Has after Delete: %v, %v", has, err)
	}

	bad := cfg
	bad.SecretAccessKey = "wrong"
	wrong, _ := s3store.New(bad, nil)
	if err := wrong.Check(ctx); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Fatalf("Check with a wrong secret: %v", err)
	}
	if err := wrong.Put(ctx, "x", strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("Put with a wrong secret: %v; want the server's 403 and its code", err)
	}
	missing := cfg
	missing.Bucket = "no-such-bucket"
	m, _ := s3store.New(missing, nil)
	if err := m.Check(ctx); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Check of a missing bucket: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := s3store.Config{Endpoint: "http://127.0.0.1:9000", Bucket: "b", AccessKeyID: "k", SecretAccessKey: "s"}
	for name, tc := range map[string]struct {
		edit func(*s3store.Config)
		want string
	}{
		"no endpoint":     {func(c *s3store.Config) { c.Endpoint = "" }, "endpoint is empty"},
		"endpoint scheme": {func(c *s3store.Config) { c.Endpoint = "s3://x" }, "http:// or https://"},
		"endpoint path":   {func(c *s3store.Config) { c.Endpoint = "http://x/bucket" }, "no path"},
		"no bucket":       {func(c *s3store.Config) { c.Bucket = "" }, "bucket name"},
		"no secret":       {func(c *s3store.Config) { c.SecretAccessKey = "" }, "secret access key"},
	} {
		c := ok
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", name, err, tc.want)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}
