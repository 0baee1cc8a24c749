package shell

// Action is what policy says about a call or one part of it: run it, ask a person first, or refuse it.
// The policy engine's Action is this type.
type Action string

// The three actions, from the most lenient to the strictest.
const (
	Allow Action = "allow"
	Ask   Action = "ask"
	Deny  Action = "deny"
)

// rank orders actions by strictness. Anything that is not a known action ranks as deny, so a corrupt
// value fails closed.
func (a Action) rank() int {
	switch a {
	case Allow:
		return 0
	case Ask:
		return 1
	default:
		return 2
	}
}

// StricterThan reports whether a is strictly stricter than b (deny over ask over allow). An unknown
// action counts as deny.
func (a Action) StricterThan(b Action) bool { return a.rank() > b.rank() }

// Stricter returns the stricter of a and b (deny over ask over allow). An unknown action counts as deny.
func (a Action) Stricter(b Action) Action {
	if b.rank() > a.rank() {
		return normalizeAction(b)
	}
	return normalizeAction(a)
}

// Valid reports whether a is allow, ask or deny.
func (a Action) Valid() bool {
	return a == Allow || a == Ask || a == Deny
}

func normalizeAction(a Action) Action {
	if a.Valid() {
		return a
	}
	return Deny
}
