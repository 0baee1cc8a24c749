package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/policy/shell"
)

// The policy file format (docs/policy.md describes it for operators). Every struct is decoded strictly:
// an unknown field is an error, so a typo never silently loosens or tightens a policy.

type fileRoot struct {
	Version   int `yaml:"version"`
	fileLayer `yaml:",inline"`
	Tenants   map[string]fileTenant `yaml:"tenants"`
}

type fileTenant struct {
	// File names a file holding the tenant's layer, relative to the main file's directory (Load only).
	File      string `yaml:"file"`
	fileLayer `yaml:",inline"`
}

type fileLayer struct {
	DefaultAction string              `yaml:"default_action"`
	Kinds         map[string]string   `yaml:"kinds"`
	Limits        fileLimits          `yaml:"limits"`
	Paths         filePaths           `yaml:"paths"`
	Commands      []fileCommandRule   `yaml:"commands"`
	Tools         map[string]fileTool `yaml:"tools"`
	// BuiltinAsks sets what the asks of built-in checks become (redirect-write: allow). The operator's
	// layer may set allow, ask or deny; a tenant's layer only ask or deny.
	BuiltinAsks map[string]string `yaml:"builtin_asks"`
	// Images lists the OCI images a call may ask for (images.go).
	Images *fileImages `yaml:"images"`
}

type fileLimits struct {
	TimeoutMS    int64 `yaml:"timeout_ms"`
	OutputBytes  int64 `yaml:"output_bytes"`
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	MaxResults   int   `yaml:"max_results"`
}

type filePaths struct {
	AllowedRoots []string `yaml:"allowed_roots"`
	DeniedGlobs  []string `yaml:"denied_globs"`
}

type fileTool struct {
	Enabled        *bool      `yaml:"enabled"`
	Action         string     `yaml:"action"`
	Limits         fileLimits `yaml:"limits"`
	Paths          filePaths  `yaml:"paths"`
	AllowedDomains []string   `yaml:"allowed_domains"`
	// EgressPresets add the domains of named presets (presets.go) to AllowedDomains.
	EgressPresets []string `yaml:"egress_presets"`
	// AllowedPorts, when set, is the only destination ports egress may reach.
	AllowedPorts []int `yaml:"allowed_ports"`
	Network      *bool `yaml:"network"`
	// Images replaces its layer's images section for this tool.
	Images *fileImages `yaml:"images"`
	// WriteGitControl lets the tool's container write git's control files (config, hooks, commondir,
	// gitfiles, config.worktree); they are read-only in it otherwise.
	WriteGitControl *bool `yaml:"write_git_control"`
}

type fileCommandRule struct {
	Name     string   `yaml:"name"`
	Action   string   `yaml:"action"`
	Reason   string   `yaml:"reason"`
	Commands []string `yaml:"commands"`
}

// ConfigError is a policy file that does not validate: the file, the line when known (0 otherwise), the
// field as a dotted path ("tools.read_file.action"), and what is wrong with it.
type ConfigError struct {
	File  string
	Line  int
	Field string
	Err   error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Err.Error())
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// ParseOption adjusts how Parse and Load validate a policy.
type ParseOption func(*parseConfig)

type parseConfig struct {
	knownTools map[string]bool
}

// KnownTools makes a tool name outside names an error. Without it any tool name is accepted, so a
// policy may configure operator-defined tools the policy package has never heard of.
func KnownTools(names ...string) ParseOption {
	return func(c *parseConfig) {
		c.knownTools = make(map[string]bool, len(names))
		for _, n := range names {
			c.knownTools[n] = true
		}
	}
}

// Parse reads a policy from YAML data; source names it in errors. It is strict: unknown fields, bad
// actions, bad globs and roots are errors that name the line and field. A tenant that names a file is an
// error here (only Load reads files). The returned Policy is immutable and safe for concurrent use.
func Parse(data []byte, source string, opts ...ParseOption) (*Policy, error) {
	p, err := parsePolicy(data, source, nil, opts)
	if err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	return p, nil
}

// Load reads and parses the policy file at path and the tenant files it names (relative to its
// directory). Policy.Sources lists every file read.
func Load(path string, opts ...ParseOption) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	dir := filepath.Dir(path)
	d := newDigest()
	d.add(path, data, nil)
	read := func(name string) (string, []byte, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		b, err := os.ReadFile(name)
		if err == nil {
			d.add(name, b, nil) // in the order of Policy.sources, as Store.Watch hashes them
		}
		return name, b, err
	}
	p, err := parsePolicy(data, path, read, opts)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	p.digest = d.sum()
	return p, nil
}

type readFunc func(name string) (path string, data []byte, err error)

func parsePolicy(data []byte, source string, read readFunc, opts []ParseOption) (*Policy, error) {
	var cfg parseConfig
	for _, o := range opts {
		o(&cfg)
	}
	var root fileRoot
	doc, err := decodeStrict(data, source, &root)
	if err != nil {
		return nil, err
	}
	v := validator{file: source, doc: doc, cfg: cfg}
	if root.Version != 0 && root.Version != 1 {
		return nil, v.errf([]string{"version"}, "version %d is not supported: use 1", root.Version)
	}
	p := &Policy{source: source, sources: []string{source}, tenants: map[string]*layer{}}
	if p.global, err = v.layer(nil, root.fileLayer, "the operator's policy", false); err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(root.Tenants)) {
		t := root.Tenants[name]
		at := []string{"tenants", name}
		if err := call.ValidateName("tenant name", name); err != nil {
			return nil, v.errf(at, "%w", err)
		}
		origin := "tenant " + name + "'s policy"
		if t.File == "" {
			if p.tenants[name], err = v.layer(at, t.fileLayer, origin, true); err != nil {
				return nil, err
			}
			continue
		}
		if !isZeroLayer(t.fileLayer) {
			return nil, v.errf(at, "set either file or the tenant's fields, not both")
		}
		if read == nil {
			return nil, v.errf(append(at, "file"), "tenant files are read only when the policy is loaded from a file")
		}
		path, tdata, err := read(t.File)
		if err != nil {
			return nil, v.errf(append(at, "file"), "read tenant file: %w", err)
		}
		var tl fileLayer
		tdoc, err := decodeStrict(tdata, path, &tl)
		if err != nil {
			return nil, err
		}
		tv := validator{file: path, doc: tdoc, cfg: cfg}
		if p.tenants[name], err = tv.layer(nil, tl, origin, true); err != nil {
			return nil, err
		}
		p.sources = append(p.sources, path)
	}
	return p, nil
}

func isZeroLayer(l fileLayer) bool {
	return l.DefaultAction == "" && l.Kinds == nil && l.Limits == (fileLimits{}) && l.Paths.AllowedRoots == nil &&
		l.Paths.DeniedGlobs == nil && l.Commands == nil && l.Tools == nil && l.BuiltinAsks == nil && l.Images == nil
}

// decodeStrict decodes one YAML document into out with unknown fields rejected, and also returns the
// document's node tree, which validation uses to find line numbers.
func decodeStrict(data []byte, source string, out any) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlError(source, nil, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &ConfigError{File: source, Err: errors.New("the file is empty: write at least default_action")}
	}
	if doc.Content[0].Kind != yaml.MappingNode {
		return nil, &ConfigError{File: source, Line: doc.Content[0].Line, Err: errors.New("the file must hold a mapping of fields")}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		return nil, yamlError(source, &doc, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &ConfigError{File: source, Line: extra.Line, Err: errors.New("the file holds more than one YAML document")}
	}
	return &doc, nil
}

var (
	yamlLineRE     = regexp.MustCompile(`line (\d+): (.*)`)
	yamlUnknownRE  = regexp.MustCompile(`^field (\S+) not found in type`)
	yamlCannotRE   = regexp.MustCompile(`^cannot unmarshal (\S+) ` + "`" + `(.*)` + "`" + ` into (\S+)`)
	yamlTypeByName = map[string]string{"int": "a whole number", "int64": "a whole number", "bool": "true or false",
		"string": "a string", "[]string": "a list of strings"}
)

// yamlError turns a yaml.v3 error into a ConfigError with the line and, where the node tree allows, the
// field path.
func yamlError(source string, doc *yaml.Node, err error) error {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	m := yamlLineRE.FindStringSubmatch(msg)
	if m == nil {
		return &ConfigError{File: source, Err: errors.New(msg)}
	}
	line, _ := strconv.Atoi(m[1])
	what := m[2]
	ce := &ConfigError{File: source, Line: line, Err: errors.New(what)}
	if u := yamlUnknownRE.FindStringSubmatch(what); u != nil {
		ce.Err = fmt.Errorf("unknown field %q: check its spelling and indentation against docs/policy.md", u[1])
		if doc != nil {
			ce.Field = strings.Join(pathAtLine(doc, line, u[1]), ".")
		}
	} else if c := yamlCannotRE.FindStringSubmatch(what); c != nil {
		want := yamlTypeByName[strings.TrimPrefix(c[3], "policy.")]
		if want == "" {
			want = "a " + strings.TrimPrefix(c[3], "policy.file")
		}
		ce.Err = fmt.Errorf("%q is not valid here: write %s", c[2], want)
		if doc != nil {
			ce.Field = strings.Join(pathAtLine(doc, line, ""), ".")
		}
	}
	return ce
}

// pathAtLine finds the field path of the key on line (named key, when key is not empty).
func pathAtLine(n *yaml.Node, line int, key string) []string {
	var walk func(n *yaml.Node, at []string) []string
	walk = func(n *yaml.Node, at []string) []string {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if p := walk(c, at); p != nil {
					return p
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, val := n.Content[i], n.Content[i+1]
				here := append(append([]string(nil), at...), k.Value)
				if k.Line == line && (key == "" || k.Value == key) {
					return here
				}
				if key == "" && val.Line == line && val.Kind == yaml.ScalarNode {
					return here
				}
				if p := walk(val, here); p != nil {
					return p
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				here := append(append([]string(nil), at...), strconv.Itoa(i))
				if key == "" && c.Line == line && c.Kind == yaml.ScalarNode {
					return here
				}
				if p := walk(c, here); p != nil {
					return p
				}
			}
		}
		return nil
	}
	return walk(n, nil)
}

// lineOf returns the line of the field at path in doc (the key's line for a mapping field), or of its
// deepest existing ancestor.
func lineOf(doc *yaml.Node, path []string) int {
	if doc == nil || len(doc.Content) == 0 {
		return 0
	}
	n := doc.Content[0]
	line := n.Line
	for _, p := range path {
		var next *yaml.Node
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == p {
					line = n.Content[i].Line
					next = n.Content[i+1]
					break
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(p); err == nil && i >= 0 && i < len(n.Content) {
				next = n.Content[i]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

type validator struct {
	file string
	doc  *yaml.Node
	cfg  parseConfig
}

func (v *validator) errf(path []string, format string, args ...any) error {
	return &ConfigError{File: v.file, Line: lineOf(v.doc, path), Field: dottedField(path), Err: fmt.Errorf(format, args...)}
}

// dottedField renders a field path: tools.run_shell.paths.denied_globs[2].
func dottedField(path []string) string {
	var b strings.Builder
	for i, p := range path {
		if _, err := strconv.Atoi(p); err == nil && i > 0 {
			b.WriteString("[" + p + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

func join(at []string, more ...string) []string {
	return append(append([]string(nil), at...), more...)
}

// toolKinds are the kinds a Request may carry: a tool's (tools.Tool.Kind), or a workspace operation's,
// each its own kind (workspace.Ops) so that postures and tenants can allow or ask each one.
var toolKinds = []string{"read", "edit", "delete", "move", "search", "execute", "fetch", "other",
	"workspace_create", "workspace_clone", "workspace_list", "workspace_info", "workspace_upload", "workspace_read_file",
	"workspace_archive", "workspace_snapshot", "workspace_fork", "workspace_restore", "workspace_delete", "workspace_set_image"}

func validKind(k string) bool { return slices.Contains(toolKinds, k) }

var ruleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// layer validates one layer; tenant is set for a tenant's layer, which may only tighten.
func (v *validator) layer(at []string, f fileLayer, origin string, tenant bool) (*layer, error) {
	l := &layer{origin: origin, kinds: map[string]Action{}, tools: map[string]*toolLayer{}, builtinAsks: map[string]Action{}}
	var err error
	for rule, a := range f.BuiltinAsks {
		bat := join(at, "builtin_asks", rule)
		if !slices.Contains(relaxableRules, rule) {
			return nil, v.errf(bat, "%q is not a built-in check that asks: use one of %s", rule, strings.Join(relaxableRules, ", "))
		}
		if l.builtinAsks[rule], err = parseAction(a); err != nil {
			return nil, v.errf(bat, "%w", err)
		}
		if tenant && l.builtinAsks[rule] == Allow {
			return nil, v.errf(bat, "a tenant's layer can only tighten a built-in check: use ask or deny, or set %s: allow in the operator's layer", rule)
		}
	}
	if f.DefaultAction != "" {
		if l.defaultAction, err = parseAction(f.DefaultAction); err != nil {
			return nil, v.errf(join(at, "default_action"), "%w", err)
		}
	}
	for k, a := range f.Kinds {
		if !validKind(k) {
			return nil, v.errf(join(at, "kinds", k), "%q is not a tool kind: use one of %s", k, strings.Join(toolKinds, ", "))
		}
		if l.kinds[k], err = parseAction(a); err != nil {
			return nil, v.errf(join(at, "kinds", k), "%w", err)
		}
	}
	if l.limits, err = v.limits(join(at, "limits"), f.Limits); err != nil {
		return nil, err
	}
	if l.roots, l.denied, err = v.paths(join(at, "paths"), f.Paths); err != nil {
		return nil, err
	}
	if l.images, err = v.images(join(at, "images"), f.Images); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for i, c := range f.Commands {
		rat := join(at, "commands", strconv.Itoa(i))
		r, err := v.commandRule(rat, c)
		if err != nil {
			return nil, err
		}
		if names[r.name] {
			return nil, v.errf(join(rat, "name"), "the rule name %q is used twice: give each rule its own name", r.name)
		}
		names[r.name] = true
		l.commands = append(l.commands, r)
	}
	for name, t := range f.Tools {
		tat := join(at, "tools", name)
		if err := call.ValidateName("tool name", name); err != nil {
			return nil, v.errf(tat, "%w", err)
		}
		if v.cfg.knownTools != nil && !v.cfg.knownTools[name] {
			return nil, v.errf(tat, "there is no tool named %q", name)
		}
		tl := &toolLayer{enabled: t.Enabled, network: t.Network, writeGit: t.WriteGitControl}
		if t.Action != "" {
			if tl.action, err = parseAction(t.Action); err != nil {
				return nil, v.errf(join(tat, "action"), "%w", err)
			}
		}
		if tl.limits, err = v.limits(join(tat, "limits"), t.Limits); err != nil {
			return nil, err
		}
		if tl.roots, tl.denied, err = v.paths(join(tat, "paths"), t.Paths); err != nil {
			return nil, err
		}
		if tl.images, err = v.images(join(tat, "images"), t.Images); err != nil {
			return nil, err
		}
		if t.AllowedDomains != nil || t.EgressPresets != nil {
			tl.domainsSet = true
			tl.domains = []string{}
			for i, d := range t.AllowedDomains {
				nd, err := normalizeDomainEntry(d)
				if err != nil {
					return nil, v.errf(join(tat, "allowed_domains", strconv.Itoa(i)), "%w", err)
				}
				tl.domains = append(tl.domains, nd)
			}
			for i, name := range t.EgressPresets {
				ds, err := presetDomains(name)
				if err != nil {
					return nil, v.errf(join(tat, "egress_presets", strconv.Itoa(i)), "%w", err)
				}
				for _, d := range ds {
					if !slices.Contains(tl.domains, d) {
						tl.domains = append(tl.domains, d)
					}
				}
			}
		}
		if t.AllowedPorts != nil {
			tl.ports = []int{}
			for i, p := range t.AllowedPorts {
				if p < 1 || p > 65535 {
					return nil, v.errf(join(tat, "allowed_ports", strconv.Itoa(i)), "port %d is not between 1 and 65535", p)
				}
				tl.ports = append(tl.ports, p)
			}
		}
		l.tools[name] = tl
	}
	return l, nil
}

func (v *validator) limits(at []string, f fileLimits) (limitValues, error) {
	check := func(name string, n int64) error {
		if n < 0 {
			return v.errf(join(at, name), "%d is negative: write a positive number, or leave it out for no limit", n)
		}
		return nil
	}
	for _, c := range []struct {
		name string
		n    int64
	}{{"timeout_ms", f.TimeoutMS}, {"output_bytes", f.OutputBytes}, {"max_file_bytes", f.MaxFileBytes}, {"max_results", int64(f.MaxResults)}} {
		if err := check(c.name, c.n); err != nil {
			return limitValues{}, err
		}
	}
	return limitValues{timeoutMS: f.TimeoutMS, outputBytes: f.OutputBytes, maxFileBytes: f.MaxFileBytes, maxResults: f.MaxResults}, nil
}

func (v *validator) paths(at []string, f filePaths) (roots []string, denied []deniedpath.Glob, err error) {
	if f.AllowedRoots != nil {
		roots = []string{}
		for i, r := range f.AllowedRoots {
			rat := join(at, "allowed_roots", strconv.Itoa(i))
			if r == "~" || strings.HasPrefix(r, "~/") {
				r = shell.WorkspaceRoot + r[1:]
			}
			if !strings.HasPrefix(r, "/") {
				return nil, nil, v.errf(rat, "root %q is not absolute: write it like /workspace", r)
			}
			clean, err := shell.ResolvePath(r)
			if err != nil {
				return nil, nil, v.errf(rat, "root %q: %w", r, err)
			}
			if clean != r && clean+"/" != r {
				return nil, nil, v.errf(rat, "root %q is not clean: write %q", r, clean)
			}
			roots = append(roots, clean)
		}
	}
	for i, g := range f.DeniedGlobs {
		cg, err := deniedpath.CompileGlob(g)
		if err != nil {
			return nil, nil, v.errf(join(at, "denied_globs", strconv.Itoa(i)), "%w", err)
		}
		denied = append(denied, cg)
	}
	return roots, denied, nil
}

func (v *validator) commandRule(at []string, f fileCommandRule) (commandRule, error) {
	r := commandRule{name: f.Name, reason: strings.TrimSpace(f.Reason)}
	if !ruleNameRE.MatchString(f.Name) {
		return r, v.errf(join(at, "name"), "rule name %q: use lowercase letters, digits and dashes, like read-only-commands", f.Name)
	}
	if builtinRuleNames[f.Name] {
		return r, v.errf(join(at, "name"), "%q is a built-in rule name: choose another", f.Name)
	}
	var err error
	if r.action, err = parseAction(f.Action); err != nil {
		return r, v.errf(join(at, "action"), "%w", err)
	}
	if len(f.Commands) == 0 {
		return r, v.errf(join(at, "commands"), "the rule lists no commands")
	}
	for i, c := range f.Commands {
		cat := join(at, "commands", strconv.Itoa(i))
		words := strings.Fields(c)
		if len(words) == 0 {
			return r, v.errf(cat, "the command is empty")
		}
		if strings.Contains(words[0], "/") {
			return r, v.errf(cat, "name the program without a directory (%q, not %q): /usr/bin/rm is rm", shell.CommandBase(words[0]), words[0])
		}
		for _, w := range words {
			if strings.ContainsAny(w, "'\"\\$`;|&<>(){}*?") {
				return r, v.errf(cat, "%q: a rule is a plain argv prefix of literal words, like \"git diff\": no quotes, globs or shell syntax", c)
			}
		}
		r.prefixes = append(r.prefixes, words)
	}
	return r, nil
}
