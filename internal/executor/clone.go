package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/workspace"
)

// cloneEnv is the environment git runs with: no prompt, no system or user config, and only https
// (protocol.allow), so that nothing in the repository (a submodule, a redirect to another scheme) makes it
// run a transport of another kind.
var cloneEnv = []string{
	"HOME=/tmp", "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_CONFIG_COUNT=3",
	"GIT_CONFIG_KEY_0=protocol.allow", "GIT_CONFIG_VALUE_0=never",
	"GIT_CONFIG_KEY_1=protocol.https.allow", "GIT_CONFIG_VALUE_1=always",
	"GIT_CONFIG_KEY_2=advice.detachedHead", "GIT_CONFIG_VALUE_2=false",
}

// cloneArgv is the command that fills /workspace from g: a shallow clone of a branch or tag (or of the
// default branch), or, for a commit id, a shallow fetch of that commit. The URL and ref are arguments of
// their own after "--" or as positional parameters, never parsed as options or shell text.
func cloneArgv(g workspace.Git) []string {
	if g.IsCommit() {
		return []string{"/bin/sh", "-c", `set -e; cd /workspace; git init -q; git remote add origin "$1"; ` +
			`git fetch -q --depth 1 origin "$2"; git checkout -q FETCH_HEAD`, "clone", g.URL, g.Ref}
	}
	argv := []string{"git", "clone", "--quiet", "--depth", "1"}
	if g.Ref != "" {
		argv = append(argv, "--branch", g.Ref)
	}
	return append(argv, "--", g.URL, "/workspace")
}

// cloneMargin is how long before the operation's deadline the clone's container is stopped, to move the
// tree into place or report why not.
const cloneMargin = 5 * time.Second

// Clone fills dir with a shallow clone of g, for workspace operation c (workspace_clone; a
// workspace.Fill). git runs in a container of its own, as the sandbox user,
// under the tenant's runtime and the call's image, with dir as its workspace (quota: the archive byte
// limit, so a huge repository is stopped while it downloads); its only way out is the call's egress proxy
// (as for a command granted network), narrowed to g's host. It returns what the proxy did. Its errors
// for the client to act on are *workspace.Error.
func (e *Executor) Clone(ctx context.Context, c *call.Call, g workspace.Git, dir string, lim workspace.Limits) ([]call.EgressConn, error) {
	host, err := g.Check()
	if err != nil {
		return nil, err
	}
	if !c.Limits.Network {
		return nil, &workspace.Error{Type: call.ErrPolicyDenied, Msg: "policy grants workspace_clone no network, which a clone needs: an operator grants it with tools.workspace_clone.network: true"}
	}
	narrowed := *c
	narrowed.Limits.AllowedDomains = cloneDomains(c.Limits.AllowedDomains, host)
	timeout := time.Duration(c.Limits.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline)-cloneMargin > 0 {
		// The container's own timeout ends first, so that the error says the clone took too long.
		timeout = min(timeout, time.Until(deadline)-cloneMargin)
	}
	spec := sandbox.Spec{
		ID: c.ID, Argv: cloneArgv(g), Env: cloneEnv, WorkspaceDir: dir, Image: e.cfg.Image, Tenant: c.Tenant, Runtime: c.Limits.Runtime,
		Limits: sandbox.Limits{Timeout: timeout, OutputBytes: 64 << 10, WorkspaceBytes: lim.Bytes, Network: true},
	}
	finish, err := e.withEgress(ctx, &narrowed, tools.Invocation{}, &spec)
	if err != nil {
		return nil, fmt.Errorf("clone %s: %w", g.URL, err)
	}
	out, err := e.runtime.Run(ctx, spec)
	conns := finish()
	return conns, cloneError(g, host, out, err, conns, timeout, lim)
}

// cloneDomains is the allowlist of a clone's egress: the URL's host, if policy's list (nil: none) allows it;
// else an empty list, which allows nothing.
func cloneDomains(policy []string, host string) []string {
	return egress.Intersect(egress.Rules{AllowDomains: policy}, egress.Rules{AllowDomains: []string{host}}).AllowDomains
}

// cloneError turns how the clone's container ended into the error to report, nil when it succeeded.
func cloneError(g workspace.Git, host string, out sandbox.Outcome, err error, conns []call.EgressConn, timeout time.Duration, lim workspace.Limits) error {
	fail := func(typ, format string, a ...any) error {
		return &workspace.Error{Type: typ, Msg: fmt.Sprintf(format, a...)}
	}
	stderr := strings.TrimSpace(out.Stderr.String())
	if len(stderr) > 2000 {
		stderr = "..." + stderr[len(stderr)-2000:]
	}
	refused := egressNote(conns)
	switch {
	case errors.Is(err, sandbox.ErrNoProgram):
		return fail(call.ErrInternal, "git is not installed in the sandbox's root filesystem, so toolpool cannot clone: an operator must install git on the workers (or in the call image)")
	case errors.Is(err, sandbox.ErrNoRuntime):
		return fail(call.ErrRuntimeUnavailable, "the tenant's sandbox runtime is not available on this worker, and a clone never runs under another: %v", err)
	case err != nil:
		return fmt.Errorf("clone %s: %w", g.URL, err)
	case out.TimedOut:
		return fail(call.ErrTimeout, "the clone of %s did not finish within %s: clone a smaller repository, or ask the operator for a longer timeout", g.URL, timeout)
	case out.QuotaExceeded || out.Signal == "SIGXFSZ":
		return fail(workspace.TypeTooLarge, "the clone of %s grew past %s, the limit (archive_max_bytes): clone a smaller repository", g.URL, workspace.FormatBytes(lim.Bytes))
	case out.OOMKilled:
		return fail(workspace.TypeTooLarge, "git ran out of memory cloning %s: clone a smaller repository", g.URL)
	case out.ExitCode == 0 && out.Signal == "":
		return nil
	case refused != "":
		return fail(call.ErrPolicyDenied, "the egress proxy refused the clone's connection:%s", refused)
	case g.Ref != "" && (strings.Contains(stderr, "not found in upstream") || strings.Contains(stderr, "couldn't find remote ref")):
		return fail(call.ErrInvalidParams, "%s has no branch or tag %q (git: %s): give a ref it has, or no ref for its default branch", g.URL, g.Ref, stderr)
	}
	return fail(call.ErrInvalidParams, "git could not clone %s from %s (exit %d%s): %s", g.URL, host, out.ExitCode, signalText(out.Signal), stderr)
}

func signalText(sig string) string {
	if sig == "" {
		return ""
	}
	return ", " + sig
}
