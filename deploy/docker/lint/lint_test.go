package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodDockerfile = `# syntax=docker/dockerfile:1
FROM golang:1.26 AS build
COPY app/ /src/
FROM scratch
LABEL org.opencontainers.image.title=t org.opencontainers.image.description=d \
      org.opencontainers.image.source=s org.opencontainers.image.version=v \
      org.opencontainers.image.revision=r org.opencontainers.image.licenses=l
COPY --from=build /src/app /app
USER 65532:65532
ENTRYPOINT ["/app"]
`

func TestLint(t *testing.T) {
	cases := []struct{ name, old, new, want string }{
		{name: "good"},
		{name: "shell-form entrypoint", old: `ENTRYPOINT ["/app"]`, new: `ENTRYPOINT /app`, want: "shell form"},
		{name: "no user", old: "USER 65532:65532\n", new: "", want: "sets no USER"},
		{name: "no label", old: "org.opencontainers.image.revision=r ", new: "", want: "no label org.opencontainers.image.revision"},
		{name: "missing source", old: "COPY app/", new: "COPY ap/", want: "not in the build context"},
		{name: "ignored source", old: "COPY app/", new: "COPY secret.txt", want: ".dockerignore excludes it"},
		{name: "keyword casing", old: "AS build", new: "as build", want: "FromAsCasing"},
		{name: "empty continuation", old: "FROM scratch\n", new: "FROM scratch\nRUN echo a \\\n\n  b\n", want: "Empty continuation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.MkdirAll(filepath.Join(dir, "app"), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "app", "main.go"), []byte("package main"), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("x"), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("*\n!app/\n"), 0o644))
			content := goodDockerfile
			if tc.old != "" {
				if !strings.Contains(content, tc.old) {
					t.Fatalf("the good Dockerfile has no %q", tc.old)
				}
				content = strings.Replace(content, tc.old, tc.new, 1)
			}
			df := filepath.Join(dir, "x.Dockerfile")
			must(t, os.WriteFile(df, []byte(content), 0o644))
			var out, errOut bytes.Buffer
			code := run([]string{"-context", dir, df}, &out, &errOut)
			if tc.want == "" {
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut.String())
				}
				return
			}
			if code != 1 || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("exit %d, want 1 and a problem containing %q; got:\n%s", code, tc.want, errOut.String())
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
