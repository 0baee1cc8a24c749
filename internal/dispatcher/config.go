package dispatcher

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
)

// Roles a token can carry.
const (
	RoleCaller   = "caller"   // make calls and read their results
	RoleApprover = "approver" // also list, approve and deny calls waiting for approval
)

// Token is one bearer token of a tenant. Give the token itself, or its SHA-256 in hex so that the config
// file holds no secret.
type Token struct {
	Token  string `yaml:"token,omitempty"`
	SHA256 string `yaml:"sha256,omitempty"`
	Role   string `yaml:"role,omitempty"` // caller (default) or approver
	// Name identifies the token's holder in the audit log ("ci-bot", "alice").
	Name string `yaml:"name,omitempty"`
	// Workspace is the workspace of the token's calls that name none (REST and MCP); empty means "default".
	Workspace string `yaml:"workspace,omitempty"`
}

// Tenant is one isolated customer: its calls, workspaces and policy are its own. How many calls a tenant
// may have queued and running is the queue's max_pending_per_tenant, the same for every tenant and
// enforced by the NATS server itself.
type Tenant struct {
	Name   string  `yaml:"name"`
	Tokens []Token `yaml:"tokens"`
	// OutputBytes, when set, is the tenant's default cap on what a model reads of a call's output, instead
	// of the operator's default_output_bytes; still at most max_output_bytes.
	OutputBytes int64 `yaml:"output_bytes,omitempty"`
	// Posture is how much the tenant's agents may do without a person: interactive (the default),
	// autonomous or read-only (policy.Posture, docs/policy.md).
	Posture string `yaml:"posture,omitempty"`
	// Runtime is the sandbox runtime every call of the tenant runs under ("gvisor"); empty means each
	// worker's default. A worker that lacks it refuses the call rather than run it under another.
	Runtime string `yaml:"runtime,omitempty"`
	// Image is the OCI image reference the tenant's calls run on when they ask for none (docs/images.md);
	// empty means each worker's default. Policy's images.allow governs only the images calls ask for.
	Image string `yaml:"image,omitempty"`
}

// Ceilings are the most any request may ask for, whatever policy allows: a request above one is
// refused with 422. Timeouts and output are clamped instead (MaxTimeout, MaxOutputBytes), and the
// decision says so. Zero means "no ceiling" for that field.
type Ceilings struct {
	MemoryBytes int64 `yaml:"memory_bytes"`
	CPUMillis   int64 `yaml:"cpu_millis"`
	PIDs        int64 `yaml:"pids"`
	TmpBytes    int64 `yaml:"tmp_bytes"`
}

// Config configures the HTTP API.
type Config struct {
	Tenants []Tenant `yaml:"tenants"`
	// MaxBodyBytes bounds a request body. A call's arguments travel in one queue message, so it must stay
	// below the NATS server's max payload (1 MiB on a stock server); the dispatcher checks at start.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// DefaultTimeout is a call's timeout when the request names none; MaxTimeout the most a request may ask.
	DefaultTimeout time.Duration `yaml:"default_timeout"`
	MaxTimeout     time.Duration `yaml:"max_timeout"`
	// MaxWait bounds how long one HTTP request waits for a result before answering 202.
	MaxWait time.Duration `yaml:"max_wait"`
	// DefaultOutputBytes caps what a model reads of a call's output (the envelope's output, and each of
	// stdout and stderr) when neither the request, the tenant nor a custom tool says otherwise: head and
	// tail are kept, and a note says how to read the rest by range. 30 000 bytes, about 30 000 characters
	// of ordinary output and 7 500 to 10 000 tokens, is what coding agents commonly give one tool result.
	DefaultOutputBytes int64 `yaml:"default_output_bytes"`
	// MaxOutputBytes is the most any request, tenant or tool may set that cap to; policy may lower it
	// further per tenant or tool.
	MaxOutputBytes int64 `yaml:"max_output_bytes"`
	// QueueTimeout is how long a call may wait for a worker before it ends expired, unrun; a request may
	// ask for less with deadline_ms.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// ApprovalTTL is how long a call waits for approval before it ends expired.
	ApprovalTTL time.Duration `yaml:"approval_ttl"`
	// MaxUploadBytes bounds one upload to a workspace (an archive, or a file); it travels through the
	// output store in chunks, never in one message. Zero means the default, 1 GiB.
	MaxUploadBytes int64 `yaml:"max_upload_bytes"`
	// Ceilings bound the resources a request may ask for (memory_bytes, cpu_millis, pids, tmp_bytes).
	Ceilings Ceilings `yaml:"ceilings"`
}

// DefaultConfig returns the defaults: cmd/dispatcher starts from them, and New fills a zero
// MaxUploadBytes from here.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:       960 << 10,
		DefaultTimeout:     60 * time.Second,
		MaxTimeout:         30 * time.Minute,
		MaxWait:            5 * time.Minute,
		DefaultOutputBytes: 30000,
		MaxOutputBytes:     1 << 20,
		QueueTimeout:       10 * time.Minute,
		ApprovalTTL:        time.Hour,
		MaxUploadBytes:     1 << 30,
		Ceilings:           Ceilings{MemoryBytes: 2 << 30, CPUMillis: 4000, PIDs: 1024, TmpBytes: 1 << 30},
	}
}

// Validate checks the configuration; its error names the first bad value and what to change.
func (c *Config) Validate() error {
	if len(c.Tenants) == 0 {
		return errors.New("no tenants: add one under tenants: with a name and a token")
	}
	seen := map[string]bool{}
	tokens := map[string]string{}
	for i, t := range c.Tenants {
		if err := call.ValidateTenant(t.Name); err != nil {
			return fmt.Errorf("tenants[%d]: %w", i, err)
		}
		if seen[t.Name] {
			return fmt.Errorf("tenants[%d]: tenant %q is listed twice", i, t.Name)
		}
		seen[t.Name] = true
		if t.Runtime != "" {
			if err := call.ValidateName("runtime", t.Runtime); err != nil {
				return fmt.Errorf("tenant %q: %w", t.Name, err)
			}
		}
		if t.Image != "" {
			if _, err := policy.ParseImageRef(t.Image); err != nil {
				return fmt.Errorf("tenant %q: image: %w", t.Name, err)
			}
		}
		if len(t.Tokens) == 0 {
			return fmt.Errorf("tenant %q has no tokens", t.Name)
		}
		if _, err := policy.ParsePosture(t.Posture); err != nil {
			return fmt.Errorf("tenant %q: %w", t.Name, err)
		}
		for j, tok := range t.Tokens {
			h, err := tok.hash()
			if err != nil {
				return fmt.Errorf("tenant %q tokens[%d]: %w", t.Name, j, err)
			}
			if other, dup := tokens[h]; dup {
				return fmt.Errorf("tenant %q tokens[%d]: the same token is also given to tenant %q", t.Name, j, other)
			}
			tokens[h] = t.Name
			switch tok.Role {
			case "", RoleCaller, RoleApprover:
			default:
				return fmt.Errorf("tenant %q tokens[%d]: role %q is not caller or approver", t.Name, j, tok.Role)
			}
			if tok.Workspace != "" {
				if err := call.ValidateName("workspace", tok.Workspace); err != nil {
					return fmt.Errorf("tenant %q tokens[%d]: %w", t.Name, j, err)
				}
			}
		}
	}
	switch {
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("max_body_bytes %d is below 1024: raise it (default %d)", c.MaxBodyBytes, DefaultConfig().MaxBodyBytes)
	case c.DefaultTimeout <= 0 || c.MaxTimeout < c.DefaultTimeout:
		return fmt.Errorf("default_timeout %s must be positive and at most max_timeout %s", c.DefaultTimeout, c.MaxTimeout)
	case c.MaxWait <= 0:
		return fmt.Errorf("max_wait %s must be positive (default %s)", c.MaxWait, DefaultConfig().MaxWait)
	case c.ApprovalTTL <= 0:
		return fmt.Errorf("approval_ttl %s must be positive (default %s)", c.ApprovalTTL, DefaultConfig().ApprovalTTL)
	case c.QueueTimeout <= 0:
		return fmt.Errorf("queue_timeout %s must be positive (default %s)", c.QueueTimeout, DefaultConfig().QueueTimeout)
	case c.MaxOutputBytes < 1024:
		return fmt.Errorf("max_output_bytes %d is below 1024: raise it (default %d)", c.MaxOutputBytes, DefaultConfig().MaxOutputBytes)
	case c.MaxUploadBytes < 0:
		return fmt.Errorf("max_upload_bytes %d is negative: set a positive limit, or 0 for the default %d", c.MaxUploadBytes, DefaultConfig().MaxUploadBytes)
	case c.Ceilings.MemoryBytes < 0 || c.Ceilings.CPUMillis < 0 || c.Ceilings.PIDs < 0 || c.Ceilings.TmpBytes < 0:
		return errors.New("ceilings must not be negative: write a positive number, or 0 for no ceiling")
	case c.DefaultOutputBytes < 1024 || c.DefaultOutputBytes > c.MaxOutputBytes:
		return fmt.Errorf("default_output_bytes %d must be from 1024 to max_output_bytes %d", c.DefaultOutputBytes, c.MaxOutputBytes)
	}
	for _, t := range c.Tenants {
		if t.OutputBytes != 0 && (t.OutputBytes < 1024 || t.OutputBytes > c.MaxOutputBytes) {
			return fmt.Errorf("tenant %q output_bytes %d must be from 1024 to max_output_bytes %d", t.Name, t.OutputBytes, c.MaxOutputBytes)
		}
	}
	return nil
}

func (t Token) hash() (string, error) {
	switch {
	case t.Token != "" && t.SHA256 != "":
		return "", errors.New("give token or sha256, not both")
	case t.Token != "":
		if len(t.Token) < 3 {
			return "", errors.New("token is shorter than 3 characters")
		}
		sum := sha256.Sum256([]byte(t.Token))
		return hex.EncodeToString(sum[:]), nil
	case len(t.SHA256) == 64:
		if _, err := hex.DecodeString(t.SHA256); err != nil {
			return "", fmt.Errorf("sha256 is not hex: %w", err)
		}
		return t.SHA256, nil
	default:
		return "", errors.New("give token, or sha256 as 64 hex digits")
	}
}

// check refuses a request that asks for more than a ceiling allows, saying how much it may ask for.
func (c Ceilings) check(req *call.Request) error {
	for _, f := range []struct {
		name       string
		asked, max int64
		unit       string
	}{
		{"memory_bytes", req.MemoryBytes, c.MemoryBytes, "bytes"},
		{"cpu_millis", req.CPUMillis, c.CPUMillis, "thousandths of a CPU"},
		{"pids", req.PIDs, c.PIDs, "processes"},
		{"tmp_bytes", req.TmpBytes, c.TmpBytes, "bytes"},
	} {
		if f.max > 0 && f.asked > f.max {
			return &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams,
				Message: fmt.Sprintf("%s %d is above this server's ceiling of %d %s: ask for at most %d, or leave %s out for the default", f.name, f.asked, f.max, f.unit, f.max, f.name)}
		}
	}
	return nil
}
