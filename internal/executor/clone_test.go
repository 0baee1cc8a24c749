package executor

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/workspace"
)

// TestCloneDomains: a clone's egress reaches the URL's host only, and only when policy's list allows it.
func TestCloneDomains(t *testing.T) {
	for _, tc := range []struct {
		policy []string
		host   string
		want   []string
	}{
		{nil, "git.test", []string{"git.test"}},
		{[]string{"git.test", "files.test"}, "git.test", []string{"git.test"}},
		{[]string{"*.corp.test"}, "git.corp.test", []string{"git.corp.test"}},
		{[]string{"files.test"}, "git.test", []string{}},
		{[]string{}, "git.test", []string{}},
	} {
		if got := cloneDomains(tc.policy, tc.host); !slices.Equal(got, tc.want) || got == nil {
			t.Errorf("cloneDomains(%q, %s) = %#v, want %#v", tc.policy, tc.host, got, tc.want)
		}
	}
}

// TestCloneArgv: URL and ref are arguments of their own, after "--" or as positional parameters.
func TestCloneArgv(t *testing.T) {
	url := "https://h/r.git"
	if got, want := cloneArgv(workspace.Git{URL: url, Ref: "main"}), []string{"git", "clone", "--quiet", "--depth", "1", "--branch", "main", "--", url, "/workspace"}; !slices.Equal(got, want) {
		t.Errorf("branch: %q, want %q", got, want)
	}
	if got := cloneArgv(workspace.Git{URL: url}); slices.Contains(got, "--branch") || got[len(got)-2] != url {
		t.Errorf("default branch: %q", got)
	}
	sha := strings.Repeat("a", 40)
	got := cloneArgv(workspace.Git{URL: url, Ref: sha})
	if got[0] != "/bin/sh" || !slices.Equal(got[len(got)-2:], []string{url, sha}) || strings.Contains(got[2], url) || strings.Contains(got[2], sha) {
		t.Errorf("commit: %q; want the URL and commit as positional parameters, not in the script", got)
	}
}

// TestCloneError: how the clone's container ended becomes an error the client can act on.
func TestCloneError(t *testing.T) {
	g := workspace.Git{URL: "https://git.test/r.git", Ref: "nope"}
	lim := workspace.Limits{Files: 10, Bytes: 1 << 20}
	failed := func(stderr string) sandbox.Outcome {
		return sandbox.Outcome{ExitCode: 128, Stderr: sandbox.Captured{Head: []byte(stderr), Total: int64(len(stderr))}}
	}
	refused := []call.EgressConn{{Host: "git.test", Port: 443, Decision: call.EgressRefused, Rule: "domain-not-allowed", Reason: "it is not among the allowed domains (none)"}}
	for _, tc := range []struct {
		name  string
		out   sandbox.Outcome
		err   error
		conns []call.EgressConn
		typ   string // "" for success
		msg   string
	}{
		{"ok", sandbox.Outcome{}, nil, nil, "", ""},
		{"missing branch", failed("warning: Could not find remote branch nope to clone.\nfatal: Remote branch nope not found in upstream origin"), nil, nil, call.ErrInvalidParams, `has no branch or tag "nope"`},
		{"refused by the proxy", failed("fatal: unable to access: CONNECT tunnel failed, response 403"), nil, refused, call.ErrPolicyDenied, "refused"},
		{"other failure", failed("fatal: repository not found"), nil, nil, call.ErrInvalidParams, "repository not found"},
		{"over the quota", sandbox.Outcome{ExitCode: 137, QuotaExceeded: true}, nil, nil, workspace.TypeTooLarge, "archive_max_bytes"},
		{"timeout", sandbox.Outcome{TimedOut: true}, nil, nil, call.ErrTimeout, "did not finish within 1m0s"},
		{"no git", sandbox.Outcome{}, sandbox.ErrNoProgram, nil, call.ErrInternal, "git is not installed"},
		{"runtime failure", sandbox.Outcome{}, errors.New("containerd gone"), nil, "", "containerd gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cloneError(g, "git.test", tc.out, tc.err, tc.conns, time.Minute, lim)
			var we *workspace.Error
			switch {
			case tc.msg == "":
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
			case tc.typ == "":
				if err == nil || errors.As(err, &we) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("got %v, want an infrastructure error saying %q", err, tc.msg)
				}
			case !errors.As(err, &we) || we.Type != tc.typ || !strings.Contains(we.Msg, tc.msg):
				t.Fatalf("got %v, want a %s error saying %q", err, tc.typ, tc.msg)
			}
		})
	}
}
