// Command validate checks the objects that `helm template` renders: every document is decoded strictly
// (unknown or duplicate fields, wrong types and misspelt field names fail, case-sensitively) into its
// Kubernetes API type, or into the Prometheus Operator's types for ServiceMonitor and PrometheusRule, and
// the objects are checked against each other (selectors that select nothing, references to ConfigMaps,
// Secrets, volumes and ports that do not exist).
//
// It lives in its own Go module so that k8s.io/api never enters toolpool's dependency graph.
//
//	helm template ... | validate [-external Kind/name ...] [-allow-kind group/version/Kind ...]
//	validate FILE...
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var external, allowKinds multiFlag
	fs.Var(&external, "external", "Kind/name of an object the release expects to exist already (an existing Secret, ConfigMap or claim); repeatable")
	fs.Var(&allowKinds, "allow-kind", "apiVersion/Kind to accept without a schema (e.g. example.com/v1/Widget); repeatable")
	quiet := fs.Bool("q", false, "print nothing on success")
	dump := fs.String("dump-configmaps", "", "write every rendered ConfigMap's keys to DIR/NAME/KEY (to feed the binaries the rendered configs)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts := Options{External: external, AllowKinds: allowKinds}
	var inputs []namedReader
	if fs.NArg() == 0 {
		inputs = append(inputs, namedReader{"stdin", stdin})
	}
	for _, path := range fs.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(stderr, "validate:", err)
			return 2
		}
		defer f.Close()
		inputs = append(inputs, namedReader{path, f})
	}
	var objs []*Object
	for _, in := range inputs {
		got, err := ReadObjects(in.name, in.r)
		if err != nil {
			fmt.Fprintln(stderr, "validate:", err)
			return 1
		}
		objs = append(objs, got...)
	}
	problems := Validate(objs, opts)
	for _, p := range problems {
		fmt.Fprintln(stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "validate: %d objects, %d problems\n", len(objs), len(problems))
		return 1
	}
	if *dump != "" {
		if err := dumpConfigMaps(objs, *dump); err != nil {
			fmt.Fprintln(stderr, "validate:", err)
			return 1
		}
	}
	if !*quiet {
		fmt.Fprintf(stdout, "validate: %d objects, all valid\n", len(objs))
	}
	return 0
}

type namedReader struct {
	name string
	r    io.Reader
}

// dumpConfigMaps writes each ConfigMap's data keys to dir/NAME/KEY.
func dumpConfigMaps(objs []*Object, dir string) error {
	for _, o := range objs {
		cm, ok := o.Typed.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		if err := os.MkdirAll(filepath.Join(dir, cm.Name), 0o755); err != nil {
			return fmt.Errorf("dump configmaps: %w", err)
		}
		for key, value := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, cm.Name, key), []byte(value), 0o644); err != nil {
				return fmt.Errorf("dump configmaps: %w", err)
			}
		}
	}
	return nil
}
