package shell

// The analyser's bounds, for the tests of package shell_test, which judge lines through the policy
// engine.
const (
	MaxCommandBytes = maxCommandBytes
	MaxNesting      = maxNesting
	MaxUnwrap       = maxUnwrap
)
