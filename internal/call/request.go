package call

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Request is a caller's request for one call, as a protocol front end other than POST /v1/calls (MCP's
// tools/call) hands it to the dispatcher's call path.
type Request struct {
	Tool string
	// Args are the tool's arguments as received; their SHA-256 (ArgsDigest) is what an approval binds to.
	Args json.RawMessage
	// Workspace names the tenant's workspace; empty means the token's default workspace, else "default".
	Workspace string
	// ID, when not empty, is the call's id instead of a fresh one: a front end that must name a call from
	// another request (a cancellation that arrives elsewhere) derives it with DeriveID. A second request
	// with the same ID finds the call the first one created, as an idempotency key does.
	ID string
}

// Rejection is why a request did not become a call, or why an operation on a call was refused. Type is
// one of the error types of ErrorInfo (invalid_params, not_found, permission_denied, quota_exceeded,
// internal, ...); Message is written for the model or the person who sent it.
type Rejection struct {
	Type    string
	Message string
	// RetryAfter, when positive, is how long to wait before retrying (quota, a transient failure).
	RetryAfter time.Duration
}

func (r *Rejection) Error() string { return r.Type + ": " + r.Message }

// ArgsDigest is "sha256:" and the hex SHA-256 of args as received: what an approval binds to.
func ArgsDigest(args json.RawMessage) string {
	sum := sha256.Sum256(args)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// DeriveID returns a call id (the shape NewID returns) that is a function of parts: the same parts give
// the same id, and different parts give different ids. The parts must hold something unguessable (a
// random session id) when the id must not be predictable.
func DeriveID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s", len(p), p)
	}
	return "c_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)[:16]))
}

// ValidID reports whether id has the shape of a call id: "c_" and 26 characters of lowercase base32.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, "c_")
	if !ok || len(rest) != 26 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}
