// Command lint checks toolpool's Dockerfiles without a Docker engine: each is parsed by BuildKit's own
// Dockerfile parser and instruction checks (the rules `docker build --check` applies while parsing), and
// then held to the project's rules: every COPY or ADD source exists in the build context and is not
// excluded by .dockerignore, ENTRYPOINT is in exec form, the final stage sets USER explicitly, and the
// final image carries the OCI labels.
//
// It lives in its own Go module so that BuildKit never enters toolpool's dependency graph.
//
//	lint -context REPO_ROOT FILE.Dockerfile...
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// requiredLabels are the OCI annotations every final image must carry.
var requiredLabels = []string{
	"org.opencontainers.image.title",
	"org.opencontainers.image.description",
	"org.opencontainers.image.source",
	"org.opencontainers.image.version",
	"org.opencontainers.image.revision",
	"org.opencontainers.image.licenses",
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("lint", flag.ContinueOnError)
	fset.SetOutput(stderr)
	context := fset.String("context", ".", "the build context (the repository root)")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	if fset.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: lint -context DIR FILE.Dockerfile...")
		return 2
	}
	pm, err := dockerignore(*context)
	if err != nil {
		fmt.Fprintln(stderr, "lint:", err)
		return 2
	}
	failed := false
	for _, path := range fset.Args() {
		problems, err := lintFile(path, *context, pm)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, p := range problems {
			fmt.Fprintf(stderr, "%s: %s\n", path, p)
		}
		if len(problems) > 0 {
			failed = true
			continue
		}
		fmt.Fprintf(stdout, "lint: %s: ok\n", path)
	}
	if failed {
		return 1
	}
	return 0
}

// dockerignore reads CONTEXT/.dockerignore (none: nothing is excluded).
func dockerignore(context string) (*patternmatcher.PatternMatcher, error) {
	var patterns []string
	f, err := os.Open(filepath.Join(context, ".dockerignore"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	default:
		defer f.Close()
		if patterns, err = ignorefile.ReadAll(f); err != nil {
			return nil, fmt.Errorf("read .dockerignore: %w", err)
		}
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf("parse .dockerignore: %w", err)
	}
	return pm, nil
}

func lintFile(path, context string, pm *patternmatcher.PatternMatcher) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	var problems []string
	for _, w := range res.Warnings {
		problems = append(problems, fmt.Sprintf("line %d: %s", w.Location.Start.Line, w.Short))
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		problems = append(problems, fmt.Sprintf("line %d: %s: %s", line, rule, msg))
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		return problems, fmt.Errorf("instructions: %w", err)
	}
	if len(stages) == 0 {
		return append(problems, "no stage"), nil
	}
	for _, st := range stages {
		for _, cmd := range st.Commands {
			switch c := cmd.(type) {
			case *instructions.CopyCommand:
				if c.From == "" {
					problems = append(problems, checkSources(c.SourcePaths, context, pm)...)
				}
			case *instructions.AddCommand:
				problems = append(problems, checkSources(c.SourcePaths, context, pm)...)
			}
		}
	}
	final := stages[len(stages)-1]
	var hasUser, hasEntrypoint bool
	labels := map[string]bool{}
	for _, cmd := range final.Commands {
		switch c := cmd.(type) {
		case *instructions.UserCommand:
			hasUser = true
		case *instructions.EntrypointCommand:
			hasEntrypoint = true
			if c.PrependShell {
				problems = append(problems, "ENTRYPOINT is in shell form: use the exec (JSON) form so that signals reach the process")
			}
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				labels[kv.Key] = true
			}
		}
	}
	if !hasUser {
		problems = append(problems, "the final stage sets no USER: say which user the image runs as")
	}
	if !hasEntrypoint {
		problems = append(problems, "the final stage has no ENTRYPOINT")
	}
	for _, l := range requiredLabels {
		if !labels[l] {
			problems = append(problems, "the final image has no label "+l)
		}
	}
	return problems, nil
}

// checkSources checks that each source of a COPY or ADD exists in the context and that .dockerignore lets
// at least one file of it through. URLs are not checked.
func checkSources(sources []string, context string, pm *patternmatcher.PatternMatcher) []string {
	var problems []string
	for _, src := range sources {
		if strings.Contains(src, "://") || strings.Contains(src, "$") {
			continue
		}
		rel := filepath.Clean(strings.TrimPrefix(src, "/"))
		full := filepath.Join(context, rel)
		fi, err := os.Stat(full)
		if err != nil {
			problems = append(problems, fmt.Sprintf("COPY source %s: not in the build context: %v", src, err))
			continue
		}
		sent := false
		if !fi.IsDir() {
			sent = included(pm, rel)
		} else {
			_ = filepath.WalkDir(full, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || sent {
					return err
				}
				r, _ := filepath.Rel(context, p)
				sent = included(pm, filepath.ToSlash(r))
				return nil
			})
		}
		if !sent {
			problems = append(problems, fmt.Sprintf("COPY source %s: .dockerignore excludes it", src))
		}
	}
	return problems
}

func included(pm *patternmatcher.PatternMatcher, rel string) bool {
	excluded, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
	return err == nil && !excluded
}
