package shell

// Finding is one part's verdict: the analyser's own, or the Rules' verdict on one command. The
// strictest finding of a line becomes its result.
type Finding struct {
	Action Action
	Rule   string // a built-in rule name (the Rule... constants) or the name of a command rule
	Detail string // what the model should know, without the "denied by rule x:" prefix
	// Blind marks a part the analyser could not read at all (a line that does not parse, one too long or
	// nested too deep); the autonomous posture refuses it instead of running it unread.
	Blind bool
}

// The built-in rules the analyser's own findings carry. The policy engine names them too, with its other
// built-in rules; the names are stable: clients, audit logs and tests key on them.
const (
	RuleInvalidPath     = "invalid-path"       // a path that cannot exist (NUL, empty, too long)
	RuleOutsideRoots    = "outside-roots"      // a path outside the allowed roots
	RuleDeniedPath      = "denied-path"        // a path that matches a denied glob
	RuleSystemPath      = "system-path"        // a write under /etc, /usr, /dev, ...
	RuleUnparseable     = "unparseable"        // a shell line the parser cannot read
	RuleUnresolved      = "unresolved"         // something only known at run time (eval, $CMD, globs...)
	RuleDangerousFlags  = "dangerous-flags"    // a flag that makes an allowed program write or execute
	RuleInjectionEnv    = "code-injection-env" // LD_PRELOAD, BASH_ENV, PATH, GIT_*...
	RuleDownloadToShell = "download-to-shell"  // curl ... | sh and friends
	RuleDestructive     = "destructive-command"
	RuleDeviceWrite     = "device-write"
	RuleWorldWritable   = "world-writable"
	RuleReverseShell    = "reverse-shell"
	RuleRedirectWrite   = "redirect-write" // > file, >> file, &> file
	// RuleControlCharacter refuses a shell line holding characters that shells, parsers and people read
	// differently: control characters but tab and newline, bidirectional controls, invalid UTF-8.
	RuleControlCharacter = "control-character"
)

// verdict keeps the strictest of the findings added to it; among equally strict findings the first wins,
// so the result names the leftmost offending part. Findings are added shaped (see Rules.Shape).
type verdict struct {
	best Finding
	set  bool
}

func (v *verdict) add(f Finding) {
	if !v.set || f.Action.StricterThan(v.best.Action) {
		v.best = f
		v.set = true
	}
}
