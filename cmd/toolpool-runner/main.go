// Command toolpool-runner runs toolpool's built-in tools inside a call's container. The worker mounts it
// read-only at /.toolpool/runner (incontainer.RunnerPath) in each container that needs it; nothing runs it on
// the host.
//
//	toolpool-runner tool-runner TOOL          run a built-in tool on /workspace (its arguments on stdin)
//	toolpool-runner egress-forward -- CMD...  run CMD behind the egress forwarder
//
// It is apart from the worker's binary so that a tool call starts only what runs in a container: the
// worker's binary spends ~60 ms of CPU initialising its containerd, NATS, OpenTelemetry and Prometheus
// clients before main, at every start.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

const usage = "usage: toolpool-runner tool-runner TOOL < args.json | egress-forward -- COMMAND [ARG...]\n" +
	"toolpool-runner runs inside a call's container, where the worker mounts it; it is not run by hand."

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == incontainer.RunnerCommand:
		os.Exit(incontainer.RunnerMain(context.Background(), os.Args[2], incontainer.WorkspaceDir, os.Stdin, os.Stdout))
	case len(os.Args) >= 2 && os.Args[1] == incontainer.ForwardCommand:
		os.Exit(incontainer.ForwardMain(context.Background(), os.Args[2:], incontainer.ForwarderAddr, incontainer.EgressSocket, os.Stderr))
	}
	fmt.Fprintln(os.Stderr, usage)
	os.Exit(2)
}
