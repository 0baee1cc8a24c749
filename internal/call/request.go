package call

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Request is a caller's request for one call, as the dispatcher's call service takes it from any front
// end: the HTTP API decodes it from the body of POST /v1/calls, MCP builds it from a tools/call.
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
	// IdempotencyKey, when not empty, names the call for the tenant: a second request with it finds the
	// first's call, or is refused when it asks for another call.
	IdempotencyKey string
	// Tools, when not empty, is the request's "tools" object as received: tools it turns off (or on, where
	// policy lets a request choose).
	Tools json.RawMessage
	// Image, when not empty, is the OCI image reference to run the call on instead of the tenant's default
	// (policy's images.allow decides which may be asked for).
	Image string

	// The caller's asks; nil or zero means the default. The call service clamps them to what policy and
	// the server allow, and refuses an ask above a ceiling.
	TimeoutMS   *int64 // how long the call may run
	DeadlineMS  *int64 // how long it may wait in the queue
	OutputBytes int64
	MemoryBytes int64
	CPUMillis   int64
	PIDs        int64
	TmpBytes    int64
}

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
