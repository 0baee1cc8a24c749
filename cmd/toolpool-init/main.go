// Command toolpool-init is the first process of every container of the worker's warm pool: mounted
// read-only at /.toolpool/init (sandboxinit.Path), it waits on its standard input for its call's spec and
// then executes the call's program (sandboxinit.Main). Nothing runs it on the host.
//
//	toolpool-init sandbox-init
//
// It links nothing but the init, so that each pooled container's init starts in about a millisecond of
// CPU and holds about 2 MiB while it waits.
package main

import (
	"fmt"
	"os"

	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != sandboxinit.Command {
		fmt.Fprintln(os.Stderr, "usage: toolpool-init "+sandboxinit.Command+"\n"+
			"toolpool-init is the first process of a warm pool's container, where the worker mounts it; it is not run by hand.")
		os.Exit(2)
	}
	os.Exit(sandboxinit.Main(os.Stderr))
}
