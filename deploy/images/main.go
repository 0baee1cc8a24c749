// Command images assembles an OCI image from directories, one layer each, without a Docker engine and
// without a base image, and writes it as an OCI archive (a tar of an OCI image layout) that `ctr import`,
// `skopeo copy oci-archive:` and `crane push` read. scripts/images.sh prepares the directories and runs it;
// `make images` runs that.
//
// The output is reproducible: the same directories (contents, modes, owners, symlinks, hard links) and
// flags give the same image digest and the same archive bytes, whatever the files' times, the order the
// filesystem lists them in, or the machine. Every time in the image (file times, the config's created,
// history) is -epoch.
//
//	images -name toolpool.local/dispatcher:dev -o dispatcher.oci.tar -layer rootfs/ \
//	  -user 65532:65532 -entrypoint /usr/local/bin/dispatcher -cmd --listen=0.0.0.0:8080
//
// It prints the image's manifest digest on stdout.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o options
	var layers, entrypoint, cmd, env, labels, expose listFlag
	flag.StringVar(&o.name, "name", "", "the image's reference, recorded in the archive (org.opencontainers.image.ref.name and io.containerd.image.name)")
	flag.StringVar(&o.out, "o", "", "the OCI archive to write")
	flag.Var(&layers, "layer", "a directory whose tree becomes one layer, in order (repeat)")
	flag.Var(&entrypoint, "entrypoint", "one word of the entrypoint (repeat)")
	flag.Var(&cmd, "cmd", "one word of the default arguments (repeat)")
	flag.Var(&env, "env", "KEY=VALUE in the image's environment (repeat)")
	flag.Var(&labels, "label", "KEY=VALUE label (repeat)")
	flag.Var(&expose, "expose", "a port the image listens on, e.g. 8080/tcp (repeat)")
	flag.StringVar(&o.user, "user", "", "the user the image runs as, uid:gid")
	flag.StringVar(&o.workdir, "workdir", "", "the working directory")
	flag.Int64Var(&o.epoch, "epoch", 0, "every time in the image, in seconds since 1970 (SOURCE_DATE_EPOCH)")
	flag.Parse()
	o.layers, o.entrypoint, o.cmd, o.env, o.expose = layers, entrypoint, cmd, env, expose
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q: every input is a flag (images -help)", flag.Args()))
	}
	var err error
	if o.labels, err = keyValues("label", labels); err != nil {
		fail(err)
	}
	digest, err := build(o)
	if err != nil {
		fail(err)
	}
	fmt.Println(digest)
}

func keyValues(what string, kvs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-%s %q: want KEY=VALUE", what, kv)
		}
		m[k] = v
	}
	return m, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "images:", err)
	os.Exit(1)
}
