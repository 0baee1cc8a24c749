package policy

import "context"

// Facts is what a tool's arguments say that policy needs to judge a call (tools.Tool.Facts fills it).
type Facts struct {
	// Paths are the files and directories the call reads or writes, as the model gave them: relative to
	// the workspace, absolute, or starting with "~" (the workspace root).
	Paths []string
	// Command is a shell command line (run_shell); empty for every other tool.
	Command string
	// URL is the address a fetch tool retrieves; empty for every other tool.
	URL string
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
// Command rules in a policy file carry their own names and may not reuse these.
const (
	RuleDefault          = "default"            // the layer's default_action
	RuleKindAction       = "kind-action"        // the layer's action for the tool's kind
	RuleToolAction       = "tool-action"        // the tool's own action
	RuleToolDisabled     = "tool-disabled"      // the operator or tenant disabled the tool
	RuleRequestTools     = "request-tools"      // the request's tools map disabled the tool
	RuleInvalidRequest   = "invalid-request"    // the request names no tool
	RuleInvalidPath      = "invalid-path"       // a path that cannot exist (NUL, empty, too long)
	RuleOutsideRoots     = "outside-roots"      // a path outside the allowed roots
	RuleDeniedPath       = "denied-path"        // a path that matches a denied glob
	RuleSystemPath       = "system-path"        // a write under /etc, /usr, /dev, ...
	RuleInvalidURL       = "invalid-url"        // a URL that is not http(s) or has no host
	RuleDomainNotAllowed = "domain-not-allowed" // a URL whose host is not on the allowlist
	RuleApprovedAlways   = "approved-always"    // an "approve always" rule added at run time
	RuleNoCommand        = "no-command"         // a shell line that runs no command
	RuleUnparseable      = "unparseable"        // a shell line the parser cannot read
	RuleUnresolved       = "unresolved"         // something only known at run time (eval, $CMD, globs...)
	RuleDangerousFlags   = "dangerous-flags"    // a flag that makes an allowed program write or execute
	RuleInjectionEnv     = "code-injection-env" // LD_PRELOAD, BASH_ENV, PATH, GIT_*...
	RuleDownloadToShell  = "download-to-shell"  // curl ... | sh and friends
	RuleDestructive      = "destructive-command"
	RuleDeviceWrite      = "device-write"
	RuleWorldWritable    = "world-writable"
	RuleReverseShell     = "reverse-shell"
	RuleRedirectWrite    = "redirect-write" // > file, >> file, &> file
)

var builtinRuleNames = map[string]bool{
	RuleDefault: true, RuleKindAction: true, RuleToolAction: true, RuleToolDisabled: true,
	RuleRequestTools: true, RuleInvalidRequest: true, RuleInvalidPath: true, RuleOutsideRoots: true,
	RuleDeniedPath: true, RuleSystemPath: true, RuleInvalidURL: true, RuleDomainNotAllowed: true,
	RuleApprovedAlways: true, RuleNoCommand: true, RuleUnparseable: true, RuleUnresolved: true,
	RuleDangerousFlags: true, RuleInjectionEnv: true, RuleDownloadToShell: true, RuleDestructive: true,
	RuleDeviceWrite: true, RuleWorldWritable: true, RuleReverseShell: true, RuleRedirectWrite: true,
}

// finding is one part's verdict; the strictest finding of a call becomes its Decision.
type finding struct {
	action Action
	rule   string
	detail string // what the model should know, without the "denied by rule x:" prefix
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
// so the reason names the leftmost offending part.
type verdict struct {
	best finding
	set  bool
}

func (v *verdict) add(f finding) {
	if !v.set || f.action.rank() > v.best.action.rank() {
		v.best = f
		v.set = true
	}
}
