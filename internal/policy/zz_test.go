package policy

import (
	"context"
	"fmt"
	"testing"
)

func TestZZ(t *testing.T) {
	for _, c := range []string{"cd src && cat main.go"} {
		d, s := Default().Explain(context.Background(), Request{Tool: "run_shell", Facts: Facts{Command: c}})
		fmt.Printf("%q: %s %s %s\n%+v\n", c, d.Action, d.Rule, d.Reason, s)
	}
}
