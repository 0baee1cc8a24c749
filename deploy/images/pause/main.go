// Command pause is the sandbox ("pause") container of a pod for make test-k8s, which cannot pull
// registry.k8s.io/pause: it holds the pod's namespaces, reaps the orphans re-parented to it, and exits 0 on
// SIGINT or SIGTERM, as Kubernetes' own pause does. scripts/test-k8s.sh builds it statically into
// toolpool.local/pause:dev with deploy/images and names it as the kubelet's containerd's sandbox_image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not PID 1\n")
	}
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited; one SIGCHLD may stand for several.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
