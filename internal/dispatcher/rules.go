package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolpool/toolpool/internal/policy"
)

// SharedState is shared, named state that every dispatcher replica reads and changes by compare-and-set.
type SharedState interface { // the writing half of queue.SharedState
	// UpdateState stores what edit makes of the current value (nil when none), starting over when another
	// writer changed it meanwhile.
	UpdateState(ctx context.Context, key string, edit func(old []byte) ([]byte, error)) error
}

// SharedRules is the RuleBook of a dispatcher with replicas: the approve-always rules live in shared
// state under one key, and each rule is added by compare-and-set, so that two replicas adding rules at
// once both keep theirs. local is this replica's policy store: it gets the new rule at once, and the
// whole list through the state's watch (as every other replica does).
type SharedRules struct {
	state SharedState
	key   string
	local *policy.Store
}

// NewSharedRules returns the rule book over state's key.
func NewSharedRules(state SharedState, key string, local *policy.Store) *SharedRules {
	return &SharedRules{state: state, key: key, local: local}
}

// AddAllowRule adds a rule to the shared list (adding one twice changes nothing) and to the local policy
// store.
func (s *SharedRules) AddAllowRule(ctx context.Context, tenant, tool string, argvPrefix []string) error {
	err := s.state.UpdateState(ctx, s.key, func(old []byte) ([]byte, error) {
		var rules []policy.AllowRule
		if old != nil {
			if err := json.Unmarshal(old, &rules); err != nil {
				return nil, fmt.Errorf("decode approve-always rules: %w", err)
			}
		}
		// A scratch store validates the rule and drops a duplicate the way the policy does.
		scratch := policy.NewStore(s.local.Policy())
		if err := scratch.SetAllowRules(rules); err != nil {
			return nil, err
		}
		if err := scratch.AddAllowRule(tenant, tool, argvPrefix); err != nil {
			return nil, err
		}
		return json.Marshal(scratch.AllowRules())
	})
	if err != nil {
		return err
	}
	// Only this rule: setting the whole list could undo a newer one the watch applied meanwhile.
	return s.local.AddAllowRule(tenant, tool, argvPrefix)
}
