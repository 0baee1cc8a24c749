package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
)

// What 2025-11-25 needs from one request to the next, carried without server state (see the package
// comment): a session id that encodes the client's elicitation capability, a JSON-RPC id for approval
// prompts that names the call, and call ids derived from the session and the tools/call's id.

// session is a toolpool session id, "tp1.<flags>.<random>": flags is "e" when the client declared form
// elicitation in initialize, else "n".
type session struct {
	elicits bool
	random  string
}

const sessionPrefix = "tp1."

func newSession(initParams json.RawMessage) session {
	var p struct {
		Capabilities sdk.ClientCapabilities `json:"capabilities"`
	}
	_ = json.Unmarshal(initParams, &p) // a malformed initialize is the SDK's to refuse
	return session{elicits: formElicitation(&p.Capabilities), random: rand.Text()}
}

func (s session) String() string {
	flags := "n"
	if s.elicits {
		flags = "e"
	}
	return sessionPrefix + flags + "." + s.random
}

// parseSession reads a session id this package gave; anything else is the zero session.
func parseSession(id string) session {
	rest, ok := strings.CutPrefix(id, sessionPrefix)
	flags, random, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || (flags != "e" && flags != "n") || len(random) < 16 {
		return session{}
	}
	return session{elicits: flags == "e", random: random}
}

// callID is the id of the call a 2025-11-25 tools/call with JSON-RPC id rpcID creates in s, so that a
// notifications/cancelled at another replica finds it; "" when there is no session to derive it from.
func (s session) callID(rpcID json.RawMessage) string {
	if s.random == "" || len(rpcID) == 0 {
		return ""
	}
	return call.DeriveID("mcp", s.random, string(rpcID))
}

// formElicitation reports whether caps allow an elicitation/create in form mode.
func formElicitation(caps *sdk.ClientCapabilities) bool {
	e := caps.Elicitation
	return e != nil && (e.Form != nil || e.URL == nil) // {} means form, as the spec says
}

// sideWriter lets a tool handler write to the response stream the SDK writes to: both write whole SSE
// events, one Write each, under mu.
type sideWriter struct {
	mu sync.Mutex
	http.ResponseWriter
}

func (s *sideWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ResponseWriter.Write(b)
}

// Flush flushes the response; the SDK flushes after each event through http.ResponseController.
func (s *sideWriter) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the writer below.
func (s *sideWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// approvalPrefix starts the JSON-RPC id of a 2025-11-25 approval prompt:
// "toolpool-approval:<call id>:<args digest>".
const approvalPrefix = "toolpool-approval:"

// promptLegacy writes an elicitation/create request for res's approval on the tools/call's SSE stream.
func promptLegacy(side *sideWriter, res *call.Result, args []byte) error {
	if side == nil {
		return errors.New("write approval prompt: the request has no response stream")
	}
	req, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": approvalPrefix + res.ID + ":" + res.ArgsDigest,
		"method": "elicitation/create", "params": approvalPrompt(res, args),
	})
	if err != nil {
		return fmt.Errorf("encode approval prompt: %w", err)
	}
	if _, err := side.Write(append(append([]byte("event: message\ndata: "), req...), "\n\n"...)); err != nil {
		return fmt.Errorf("write approval prompt: %w", err)
	}
	side.Flush()
	return nil
}

// answerApproval applies a client's answer to an approval prompt (a JSON-RPC response whose id this
// package gave), as the approval path of POST /v1/approvals/{id} does. It reports whether msg was such
// an answer; one that cannot be applied (an error response, a call decided meanwhile, a token that may
// not approve) is logged and changes nothing.
func (h *Handler) answerApproval(ctx context.Context, msg message) bool {
	var rpcID string
	if json.Unmarshal(msg.ID, &rpcID) != nil || !strings.HasPrefix(rpcID, approvalPrefix) {
		return false
	}
	id, digest, _ := strings.Cut(strings.TrimPrefix(rpcID, approvalPrefix), ":")
	var answer sdk.ElicitResult
	if len(msg.Error) > 0 || json.Unmarshal(msg.Result, &answer) != nil {
		h.log.WarnContext(ctx, "mcp approval prompt failed at the client", "call_id", id, "error", string(msg.Error))
		return true
	}
	if _, err := h.approvals.Decide(ctx, id, digest, answer.Action == "accept"); err != nil {
		h.log.WarnContext(ctx, "apply mcp approval answer", "call_id", id, "action", answer.Action, "error", err)
	}
	return true
}

// cancelLegacy cancels the call of the tools/call that a 2025-11-25 notifications/cancelled names. An
// unknown or finished call is ignored, as the spec says.
func (h *Handler) cancelLegacy(ctx context.Context, s session, params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return
	}
	id := s.callID(p.RequestID)
	if id == "" {
		return
	}
	if _, err := h.calls.Cancel(ctx, id); err != nil {
		var rej *call.Rejection
		if !errors.As(err, &rej) || rej.Kind != call.KindNotFound {
			h.log.WarnContext(ctx, "cancel call for mcp notifications/cancelled", "call_id", id, "error", err)
		}
	}
}
