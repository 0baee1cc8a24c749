package policy

import (
	"context"

	"github.com/toolpool/toolpool/internal/policy/shell"
)

// Facts is what a tool's arguments say that policy needs to judge a call (tools.Tool.Facts fills it).
type Facts struct {
	// Paths are the files and directories the call reads or writes, as the model gave them: relative to
	// the workspace, absolute, or starting with "~" (the workspace root).
	Paths []string
	// Command is a shell command line (run_shell); empty for every other tool.
	Command string
	// Env is the environment a shell command gets on top of the sandbox's (run_shell's env argument).
	// Policy judges its names as it judges assignments in the command text.
	Env map[string]string
	// Cwd is the directory a shell command starts in, as the model gave it; empty means the workspace
	// root. Policy resolves the command's relative paths from it.
	Cwd string
	// URL is the address a fetch tool retrieves, or the repository a workspace is cloned from; empty for
	// every other tool.
	URL string
	// Network says the operation cannot run without egress (a workspace cloned from a git URL): it is
	// denied unless policy grants the tool network, as a command's container would be granted it.
	Network bool
}

// Request is one call as policy sees it.
type Request struct {
	Tenant string
	Tool   string
	// Kind is the tool's kind: read, edit, delete, move, search, execute, fetch or other, or a workspace
	// operation's (workspace_create, workspace_delete, ...). Empty means the
	// built-in kind of a known tool, or "other".
	Kind  string
	Facts Facts
	// RequestTools is the request's "tools" map (see ParseRequestTools): a tool mapped to false is
	// refused; true changes nothing, because a request can only tighten its tenant's policy.
	RequestTools map[string]bool
	// Posture is how much the tenant's agents may do without a person (see Posture); empty means
	// PostureInteractive. The dispatcher sets it from the tenant's configuration.
	Posture Posture
}

// Limits are the effective maxima for a call, the strictest over every layer. Zero means "not limited by
// policy" (the dispatcher applies its configured default). The dispatcher clamps a request's own limits to
// these.
type Limits struct {
	TimeoutMS    int64
	OutputBytes  int64
	MaxFileBytes int64
	MaxResults   int
	// AllowedDomains is the domain allowlist for fetches: nil means no allowlist, an empty non-nil slice
	// means no domain at all. "*.example.com" stands for every subdomain of example.com.
	AllowedDomains []string
	// AllowedPorts is the destination ports egress may reach: nil means no list, an empty non-nil slice
	// means no port at all. Each layer's list narrows the ones before.
	AllowedPorts []int
	// Network grants the call's container egress; true only when every layer that mentions it grants it.
	Network bool
	// DeniedGlobs are the denied path patterns for the tool, as written in the policy files of every
	// layer. The file tools apply them inside the container, in their walks and after resolving links,
	// and the sandbox hides what they match from run_shell's container (docs/security.md).
	DeniedGlobs []string
	// ReadOnlyWorkspace is the read-only posture's promise to the sandbox: every container of the call
	// mounts the workspace read-only, whatever the decision, so that a command policy judged wrongly
	// still cannot change it. Only the posture sets it.
	ReadOnlyWorkspace bool
	// WriteGitControl lets the call's container write git's control files (a repository's config, hooks,
	// commondir, gitfiles, config.worktree, and those of its submodules), which the sandbox makes
	// read-only otherwise: true only when every layer that mentions write_git_control grants it.
	WriteGitControl bool
}

// Decision is the verdict on a call: the action, the rule that decided it and a reason written for the
// model, plus the limits the call must run within.
type Decision struct {
	Action Action
	// Rule is the stable name of the deciding rule: a built-in one (the Rule... constants) or the name of
	// a command rule in the policy file, such as "forbidden-commands".
	Rule   string
	Reason string
	Limits Limits
}

// Engine decides calls. Implementations must be safe for concurrent use; Decide does not block on I/O.
type Engine interface {
	Decide(ctx context.Context, r Request) Decision
}

// EngineFunc adapts a function to Engine, like http.HandlerFunc.
type EngineFunc func(ctx context.Context, r Request) Decision

// Decide calls f(ctx, r).
func (f EngineFunc) Decide(ctx context.Context, r Request) Decision { return f(ctx, r) }

// The built-in rule names a Decision may carry. They are stable: clients, audit logs and tests key on them.
// Command rules in a policy file carry their own names and may not reuse these. The shell analyser
// (package shell) owns the names of the rules its findings carry; they are repeated here.
const (
	RuleDefault          = "default"                 // the layer's default_action
	RuleKindAction       = "kind-action"             // the layer's action for the tool's kind
	RuleToolAction       = "tool-action"             // the tool's own action
	RuleToolDisabled     = "tool-disabled"           // the operator or tenant disabled the tool
	RuleRequestTools     = "request-tools"           // the request's tools map disabled the tool
	RuleInvalidRequest   = "invalid-request"         // the request names no tool
	RuleInvalidPath      = shell.RuleInvalidPath     // a path that cannot exist (NUL, empty, too long)
	RuleOutsideRoots     = shell.RuleOutsideRoots    // a path outside the allowed roots
	RuleDeniedPath       = shell.RuleDeniedPath      // a path that matches a denied glob
	RuleSystemPath       = shell.RuleSystemPath      // a write under /etc, /usr, /dev, ...
	RuleInvalidURL       = "invalid-url"             // a URL that is not http(s) or has no host
	RuleDomainNotAllowed = "domain-not-allowed"      // a URL whose host is not on the allowlist
	RuleApprovedAlways   = "approved-always"         // an "approve always" rule added at run time
	RuleNoCommand        = "no-command"              // a shell line that runs no command
	RuleUnparseable      = shell.RuleUnparseable     // a shell line the parser cannot read
	RuleUnresolved       = shell.RuleUnresolved      // something only known at run time (eval, $CMD, globs...)
	RuleDangerousFlags   = shell.RuleDangerousFlags  // a flag that makes an allowed program write or execute
	RuleInjectionEnv     = shell.RuleInjectionEnv    // LD_PRELOAD, BASH_ENV, PATH, GIT_*...
	RuleDownloadToShell  = shell.RuleDownloadToShell // curl ... | sh and friends
	RuleDestructive      = shell.RuleDestructive
	RuleDeviceWrite      = shell.RuleDeviceWrite
	RuleWorldWritable    = shell.RuleWorldWritable
	RuleReverseShell     = shell.RuleReverseShell
	RuleRedirectWrite    = shell.RuleRedirectWrite // > file, >> file, &> file
	// RuleControlCharacter refuses a shell line holding characters that shells, parsers and people read
	// differently: control characters but tab and newline, bidirectional controls, invalid UTF-8.
	RuleControlCharacter = shell.RuleControlCharacter
	// RuleNoNetwork refuses an operation that needs egress (Facts.Network) when policy grants its tool none.
	RuleNoNetwork = "no-network"
	// RulePosture is a refusal by the tenant's posture itself (read-only refuses tools that write).
	RulePosture = "posture"
)

var builtinRuleNames = map[string]bool{
	RuleDefault: true, RuleKindAction: true, RuleToolAction: true, RuleToolDisabled: true,
	RuleRequestTools: true, RuleInvalidRequest: true, RuleInvalidPath: true, RuleOutsideRoots: true,
	RuleDeniedPath: true, RuleSystemPath: true, RuleInvalidURL: true, RuleDomainNotAllowed: true,
	RuleApprovedAlways: true, RuleNoCommand: true, RuleUnparseable: true, RuleUnresolved: true,
	RuleDangerousFlags: true, RuleInjectionEnv: true, RuleDownloadToShell: true, RuleDestructive: true,
	RuleDeviceWrite: true, RuleWorldWritable: true, RuleReverseShell: true, RuleRedirectWrite: true,
	RuleControlCharacter: true, RulePosture: true, RuleNoNetwork: true,
}

// finding is one part's verdict; the strictest finding of a call becomes its Decision.
type finding struct {
	action Action
	rule   string
	detail string // what the model should know, without the "denied by rule x:" prefix
	// blind marks a part policy could not read at all (a line that does not parse, one too long or
	// nested too deep); the autonomous posture refuses it instead of running it unread.
	blind bool
	// shaped is set once the posture and the built-in ask settings have been applied.
	shaped bool
}

func (f finding) reason() string {
	var verb string
	switch f.action {
	case Allow:
		verb = "allowed"
	case Ask:
		verb = "needs approval"
	default:
		verb = "denied"
	}
	return verb + " by rule " + f.rule + ": " + f.detail
}

// verdict accumulates findings and keeps the strictest; among equally strict findings the first wins,
// so the reason names the leftmost offending part. A verdict made by decideEnv.newVerdict shapes every
// finding by the posture and the built-in ask settings before comparing it.
type verdict struct {
	best  finding
	set   bool
	shape func(finding) finding
}

func (v *verdict) add(f finding) {
	if v.shape != nil && !f.shaped {
		f = v.shape(f)
		f.shaped = true
	}
	if !v.set || f.action.StricterThan(v.best.action) {
		v.best = f
		v.set = true
	}
}
