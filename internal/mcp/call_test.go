package mcp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
)

// TestRejected pins the one mapping of an error's class to MCP's answer: a tool error the model reads,
// or a JSON-RPC internal error for toolpool's own failure.
func TestRejected(t *testing.T) {
	toolError := map[call.Kind]bool{
		call.KindInvalid: true, call.KindInvalidParams: true, call.KindUnauthenticated: true, call.KindForbidden: true,
		call.KindDenied: true, call.KindNotFound: true, call.KindConflict: true, call.KindTooLarge: true,
		call.KindLengthRequired: true, call.KindUnsupportedMedia: true, call.KindRangeNotSatisfiable: true,
		call.KindTenantFull: true, call.KindTimeout: true,
		call.KindInternal: false, call.KindUnavailable: false,
	}
	for _, k := range call.Kinds {
		want, ok := toolError[k]
		if !ok {
			t.Errorf("kind %s has no answer in this test: add it", k)
			continue
		}
		rej := call.Reject(k, "some_type", "what went wrong")
		res, err := rejected(fmt.Errorf("wrapped: %w", rej))
		if want {
			if err != nil || res == nil || !res.IsError || textOf(res) != "what went wrong" {
				t.Errorf("kind %s: %+v, %v; want the tool error %q", k, res, err, "what went wrong")
			}
			continue
		}
		var rpc *jsonrpc.Error
		if res != nil || !errors.As(err, &rpc) || rpc.Code != jsonrpc.CodeInternalError || rpc.Message != "toolpool failed: wrapped: some_type: what went wrong" {
			t.Errorf("kind %s: %+v, %v; want a JSON-RPC internal error", k, res, err)
		}
	}
	// The retry hint, and errors of no class.
	res, err := rejected(&call.Rejection{Kind: call.KindTenantFull, Type: call.ErrQuota, Message: "full", RetryAfter: 5 * time.Second})
	if err != nil || textOf(res) != "full (retry after 5s)" {
		t.Errorf("tenant full: %+v, %v", res, err)
	}
	for _, e := range []error{context.DeadlineExceeded, &call.Rejection{Type: call.ErrInvalidParams, Message: "no kind"}} {
		var rpc *jsonrpc.Error
		if res, err := rejected(e); res != nil || !errors.As(err, &rpc) || rpc.Code != jsonrpc.CodeInternalError {
			t.Errorf("%v: %+v, %v; want a JSON-RPC internal error", e, res, err)
		}
	}
}

func textOf(res *sdk.CallToolResult) string {
	if res == nil || len(res.Content) != 1 {
		return ""
	}
	if tc, ok := res.Content[0].(*sdk.TextContent); ok {
		return tc.Text
	}
	return ""
}
