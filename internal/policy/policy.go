package policy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/policy/shell"
)

// Policy is a parsed, validated policy: the operator's layer and the tenants' layers. It is immutable
// and safe for concurrent use; reloading builds a new Policy (see Store).
type Policy struct {
	source  string
	sources []string
	global  *layer
	tenants map[string]*layer
	// digest hashes the files Load read (see Store.Watch); zero for a policy from Parse.
	digest [32]byte
}

// layer is one level of policy: the operator's file, or one tenant's section or file. A later layer can
// only tighten an earlier one, because every decision takes the strictest opinion of all layers.
type layer struct {
	origin        string // "the operator's policy", "tenant acme's policy": for reasons
	defaultAction Action // "" when not set
	kinds         map[string]Action
	limits        limitValues
	roots         []string // nil when not set
	denied        []deniedpath.Glob
	commands      []commandRule
	tools         map[string]*toolLayer
	builtinAsks   map[string]Action // builtin_asks: rule name to the action its asks become
	images        *imageRule        // nil when not set
}

type toolLayer struct {
	enabled    *bool
	action     Action
	limits     limitValues
	roots      []string
	denied     []deniedpath.Glob
	domains    []string
	domainsSet bool
	ports      []int // nil when not set
	network    *bool
	images     *imageRule // nil when not set
	writeGit   *bool      // write_git_control
}

// limitValues are one layer's maxima; zero means "not set".
type limitValues struct {
	timeoutMS, outputBytes, maxFileBytes int64
	maxResults                           int
}

// commandRule names shell commands by argv prefix: "git diff" matches `git diff --stat` but not
// `git difftool`, and never matches by string prefix.
type commandRule struct {
	name     string
	action   Action
	reason   string
	prefixes [][]string
}

// Source is the file or name the policy was parsed from.
func (p *Policy) Source() string { return p.source }

// Sources lists every file the policy was read from: the main file first, then tenant files.
func (p *Policy) Sources() []string { return slices.Clone(p.sources) }

// Tenants lists the tenants that have their own layer.
func (p *Policy) Tenants() []string {
	var out []string
	for t := range p.tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (p *Policy) layersFor(tenant string) []*layer {
	if t, ok := p.tenants[tenant]; ok {
		return []*layer{p.global, t}
	}
	return []*layer{p.global}
}

// builtinKinds are the kinds of toolpool's own tools, for requests that do not say.
var builtinKinds = map[string]string{
	"read_file": "read", "write_file": "edit", "edit_file": "edit", "list_files": "read",
	"glob": "search", "grep": "search", "run_shell": "execute", "web_fetch": "fetch",
}

func kindOf(r Request) string {
	if validKind(r.Kind) {
		return r.Kind
	}
	if k, ok := builtinKinds[r.Tool]; ok {
		return k
	}
	return "other"
}

// ToolEnabled reports whether tenant may use tool at all: no layer disables it and the request's tools
// map does not map it to false. GET /v1/tools lists only enabled tools.
func (p *Policy) ToolEnabled(tenant, tool string, requestTools map[string]bool) bool {
	_, ok := p.disabled(p.layersFor(tenant), tool, requestTools)
	return !ok
}

func (p *Policy) disabled(layers []*layer, tool string, requestTools map[string]bool) (finding, bool) {
	for _, l := range layers {
		if t := l.tools[tool]; t != nil && t.enabled != nil && !*t.enabled {
			return finding{action: Deny, rule: RuleToolDisabled, detail: fmt.Sprintf("%s disables the tool %s; it is not available, so use another tool", l.origin, tool)}, true
		}
	}
	if v, ok := requestTools[tool]; ok && !v {
		return finding{action: Deny, rule: RuleRequestTools, detail: fmt.Sprintf("this request's tools map turns %s off; it is not available in this request", tool)}, true
	}
	return finding{}, false
}

// Decide judges one call against the policy, with no "approve always" rules (Store.Decide adds them). It
// never blocks and ignores ctx; it is safe for concurrent use.
func (p *Policy) Decide(ctx context.Context, r Request) Decision {
	d, _ := p.decide(r, nil)
	return d
}

// Explain is Decide, and also reports what judging a shell command looked at (zero for other tools):
// for tests that compare policy with what a shell did, and for explaining a decision.
func (p *Policy) Explain(ctx context.Context, r Request) (Decision, shell.Seen) {
	return p.decide(r, nil)
}

// decideEnv is what judging one request needs.
type decideEnv struct {
	layers  []*layer
	tenant  string
	tool    string
	kind    string
	paths   shell.Paths
	approve [][]string // argv prefixes the tenant approved for this tool; an empty prefix is the whole tool
	posture Posture
	shell   bool // the request carries a shell command
	shape   func(finding) finding
}

// newVerdict returns a verdict that shapes its findings by the posture and the built-in ask settings.
func (e *decideEnv) newVerdict() verdict {
	return verdict{shape: e.shape}
}

func (p *Policy) decide(r Request, approved []AllowRule) (Decision, shell.Seen) {
	layers := p.layersFor(r.Tenant)
	d := Decision{Limits: effectiveLimits(layers, r.Tool)}
	d.Limits.DeniedGlobs = deniedSources(effectivePaths(layers, r.Tool))
	var seen shell.Seen
	finish := func(f finding) (Decision, shell.Seen) {
		d.Action, d.Rule, d.Reason = f.action, f.rule, f.reason()
		return d, seen
	}
	if r.Tool == "" {
		return finish(finding{action: Deny, rule: RuleInvalidRequest, detail: "the request names no tool; name one of the tools GET /v1/tools lists"})
	}
	if f, off := p.disabled(layers, r.Tool, r.RequestTools); off {
		return finish(f)
	}
	posture, err := ParsePosture(string(r.Posture))
	if err != nil {
		return finish(finding{action: Deny, rule: RuleInvalidRequest, detail: err.Error()})
	}
	d.Limits.ReadOnlyWorkspace = posture == PostureReadOnly
	env := &decideEnv{layers: layers, tenant: r.Tenant, tool: r.Tool, kind: kindOf(r), paths: effectivePaths(layers, r.Tool),
		posture: posture, shell: r.Facts.Command != ""}
	env.shape = env.shaper()
	for _, a := range approved {
		if a.Tenant == r.Tenant && a.Tool == r.Tool {
			env.approve = append(env.approve, a.ArgvPrefix)
		}
	}
	v := env.newVerdict()
	if f, refused := env.postureFinding(); refused {
		v.add(f)
	}
	if r.Facts.Command != "" {
		var f finding
		f, seen = env.judgeShell(r.Facts)
		v.add(f)
	} else {
		v.add(env.approved(env.toolFinding(), nil))
	}
	for _, path := range r.Facts.Paths {
		if f, bad := env.checkToolPath(path); bad {
			v.add(f)
		}
	}
	if r.Facts.Network && !d.Limits.Network {
		v.add(finding{action: Deny, rule: RuleNoNetwork, detail: fmt.Sprintf("policy grants %s no network, which it needs; an operator grants it with tools.%s.network: true and the hosts in tools.%s.allowed_domains", r.Tool, r.Tool, r.Tool)})
	}
	if r.Facts.URL != "" {
		if f, bad := checkURL(r.Facts.URL, d.Limits.AllowedDomains); bad {
			v.add(f)
		}
		if posture == PostureAutonomous && d.Limits.AllowedDomains == nil {
			v.add(finding{action: Deny, rule: RulePosture, detail: fmt.Sprintf("the autonomous posture fetches only from the domains an allowlist names, because nobody approves where a call goes; an operator sets tools.%s.allowed_domains (or egress_presets)", r.Tool)})
		}
	}
	return finish(v.best)
}

// toolFinding is the strictest opinion of the layers on the tool as a whole (the action for commands
// that no command rule names).
func (e *decideEnv) toolFinding() finding {
	v := e.newVerdict()
	for _, l := range e.layers {
		if f, ok := l.toolOpinion(e.tool, e.kind); ok {
			v.add(f)
		}
	}
	if !v.set {
		return finding{action: Ask, rule: RuleDefault, detail: fmt.Sprintf("no policy sets an action for %s, so a person must approve each call", e.tool)}
	}
	return v.best
}

func (l *layer) toolOpinion(tool, kind string) (finding, bool) {
	a, rule, why, ok := l.toolAction(tool, kind)
	if !ok {
		return finding{}, false
	}
	var detail string
	switch a {
	case Allow:
		detail = fmt.Sprintf("%s %s", l.origin, why)
	case Ask:
		detail = fmt.Sprintf("%s %s, so a person must approve this call; wait for the decision, or use a read-only tool", l.origin, why)
	default:
		detail = fmt.Sprintf("%s %s; this call will not run, so use another tool", l.origin, why)
	}
	return finding{action: a, rule: rule, detail: detail}, true
}

// toolAction is the layer's action for the tool: its own action, else the action for its kind, else the
// layer's default action. ok is false when the layer sets none of them.
func (l *layer) toolAction(tool, kind string) (a Action, rule, why string, ok bool) {
	if t := l.tools[tool]; t != nil && t.action != "" {
		return t.action, RuleToolAction, "sets " + tool + " to " + string(t.action), true
	}
	if ka, found := l.kinds[kind]; found {
		return ka, RuleKindAction, "sets tools of kind " + kind + " to " + string(ka), true
	}
	if l.defaultAction != "" {
		return l.defaultAction, RuleDefault, "sets its default action to " + string(l.defaultAction), true
	}
	return "", "", "", false
}

// approved turns an ask into an allow when the tenant approved argv (nil for the whole tool) for always.
// It never touches a deny, nor an ask from a built-in safety rule: callers pass only rule and default
// findings.
func (e *decideEnv) approved(f finding, argv []string) finding {
	if f.action != Ask {
		return f
	}
	for _, prefix := range e.approve {
		if hasPrefix(argv, prefix) {
			what := e.tool
			if len(prefix) > 0 {
				what = "`" + strings.Join(prefix, " ") + "`"
			}
			return finding{action: Allow, rule: RuleApprovedAlways, detail: fmt.Sprintf("a person approved %s for tenant %s always", what, e.tenant)}
		}
	}
	return f
}

func hasPrefix(argv, prefix []string) bool {
	if len(prefix) > len(argv) {
		return false
	}
	for i, w := range prefix {
		if argv[i] != w {
			return false
		}
	}
	return true
}

// checkToolPath judges a path a tool names: it must be a possible path, inside the roots, and not denied.
func (e *decideEnv) checkToolPath(p string) (finding, bool) {
	resolved, err := shell.ResolvePath(p)
	if err != nil {
		return finding{action: Deny, rule: RuleInvalidPath, detail: fmt.Sprintf("the path %.80q cannot be used: %v", p, err)}, true
	}
	if !e.paths.InRoots(resolved) {
		return finding{action: Deny, rule: RuleOutsideRoots, detail: fmt.Sprintf("%s is outside the directories this tool may use (%s); use a path inside the workspace", resolved, e.paths.RootsText())}, true
	}
	if g, ok := e.paths.DeniedBy(resolved); ok {
		return finding{action: Deny, rule: RuleDeniedPath, detail: shell.DeniedDetail(resolved, g)}, true
	}
	return finding{}, false
}

// effectivePaths combines the layers' roots and denied globs for tool. Within a layer, the tool's roots
// replace the layer's, and the denied globs add up.
func effectivePaths(layers []*layer, tool string) shell.Paths {
	var r shell.Paths
	for _, l := range layers {
		roots := l.roots
		r.Denied = append(r.Denied, l.denied...)
		if t := l.tools[tool]; t != nil {
			if t.roots != nil {
				roots = t.roots
			}
			r.Denied = append(r.Denied, t.denied...)
		}
		if roots != nil {
			r.Roots = append(r.Roots, roots)
		}
	}
	if len(r.Roots) == 0 {
		r.Roots = [][]string{{shell.WorkspaceRoot}}
	}
	return r
}

// deniedSources lists the denied globs of r as written in the policy files.
func deniedSources(r shell.Paths) []string {
	out := make([]string, 0, len(r.Denied))
	for _, g := range r.Denied {
		out = append(out, g.Source())
	}
	return out
}

// effectiveLimits takes, field by field, the smallest limit any layer sets for tool (a tool's own limit
// replaces its layer's).
func effectiveLimits(layers []*layer, tool string) Limits {
	var out Limits
	minInt64 := func(cur *int64, v int64) {
		if v > 0 && (*cur == 0 || v < *cur) {
			*cur = v
		}
	}
	networkSet, writeGitSet := false, false
	network, writeGit := true, true
	for _, l := range layers {
		lv := l.limits
		t := l.tools[tool]
		if t != nil {
			lv = overlayLimits(lv, t.limits)
		}
		minInt64(&out.TimeoutMS, lv.timeoutMS)
		minInt64(&out.OutputBytes, lv.outputBytes)
		minInt64(&out.MaxFileBytes, lv.maxFileBytes)
		if lv.maxResults > 0 && (out.MaxResults == 0 || lv.maxResults < out.MaxResults) {
			out.MaxResults = lv.maxResults
		}
		if t == nil {
			continue
		}
		if t.network != nil {
			networkSet = true
			network = network && *t.network
		}
		if t.writeGit != nil {
			writeGitSet = true
			writeGit = writeGit && *t.writeGit
		}
		if t.domainsSet {
			if out.AllowedDomains == nil {
				out.AllowedDomains = slices.Clone(t.domains)
			} else {
				out.AllowedDomains = intersectDomains(out.AllowedDomains, t.domains)
			}
		}
		if t.ports != nil {
			if out.AllowedPorts == nil {
				out.AllowedPorts = slices.Clone(t.ports)
			} else {
				out.AllowedPorts = slices.DeleteFunc(out.AllowedPorts, func(p int) bool { return !slices.Contains(t.ports, p) })
			}
		}
	}
	out.Network = networkSet && network
	out.WriteGitControl = writeGitSet && writeGit
	return out
}

func overlayLimits(base, over limitValues) limitValues {
	if over.timeoutMS > 0 {
		base.timeoutMS = over.timeoutMS
	}
	if over.outputBytes > 0 {
		base.outputBytes = over.outputBytes
	}
	if over.maxFileBytes > 0 {
		base.maxFileBytes = over.maxFileBytes
	}
	if over.maxResults > 0 {
		base.maxResults = over.maxResults
	}
	return base
}

// normalizeDomainEntry validates an allowlist entry: a host name ("docs.python.org") or every subdomain
// of one ("*.python.org").
func normalizeDomainEntry(d string) (string, error) {
	d = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(d), "."))
	host := strings.TrimPrefix(d, "*.")
	switch {
	case host == "":
		return "", fmt.Errorf("domain %q is empty", d)
	case strings.ContainsAny(host, "/:@?#* \t"):
		return "", fmt.Errorf("domain %q: write a bare host name like docs.python.org, or *.python.org for its subdomains, without scheme, port or path", d)
	case strings.HasPrefix(host, ".") || strings.Contains(host, ".."):
		return "", fmt.Errorf("domain %q has an empty label", d)
	}
	return d, nil
}

func domainAllowed(list []string, host string) bool {
	for _, e := range list {
		if e == host {
			return true
		}
		if suffix, ok := strings.CutPrefix(e, "*"); ok && strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
			return true
		}
	}
	return false
}

// intersectDomains keeps the entries of either list that the other list covers.
func intersectDomains(a, b []string) []string {
	out := []string{}
	covers := func(list []string, e string) bool {
		if rest, ok := strings.CutPrefix(e, "*."); ok {
			// "*.x" is covered by "*.x" or by "*.y" where x ends in ".y".
			for _, l := range list {
				if l == e || (strings.HasPrefix(l, "*.") && strings.HasSuffix(rest, l[1:])) {
					return true
				}
			}
			return false
		}
		return domainAllowed(list, e)
	}
	for _, e := range a {
		if covers(b, e) && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	for _, e := range b {
		if covers(a, e) && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// checkURL judges a fetch: http or https, a host, and the host on the allowlist when there is one.
func checkURL(raw string, allowed []string) (finding, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return finding{action: Deny, rule: RuleInvalidURL, detail: fmt.Sprintf("the URL %.100q cannot be parsed: %v", raw, err)}, true
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return finding{action: Deny, rule: RuleInvalidURL, detail: fmt.Sprintf("the URL scheme %q is not allowed; fetch http:// or https:// URLs only", u.Scheme)}, true
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "" {
		return finding{action: Deny, rule: RuleInvalidURL, detail: fmt.Sprintf("the URL %.100q has no host", raw)}, true
	}
	if allowed != nil && !domainAllowed(allowed, host) {
		if net.ParseIP(host) != nil {
			return finding{action: Deny, rule: RuleDomainNotAllowed, detail: fmt.Sprintf("%s is an IP address and only these domains may be fetched: %s", host, strings.Join(allowed, ", "))}, true
		}
		list := strings.Join(allowed, ", ")
		if len(allowed) == 0 {
			list = "none"
		}
		return finding{action: Deny, rule: RuleDomainNotAllowed, detail: fmt.Sprintf("%s is not on the domain allowlist (%s); use an allowed domain, or ask the operator to add it to the tool's allowed_domains", host, list)}, true
	}
	return finding{}, false
}
