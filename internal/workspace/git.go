package workspace

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"

	"github.com/toolpool/toolpool/internal/call"
)

// Git is the source of a workspace seeded from a git repository (OpClone): an https URL, and a branch,
// tag or full commit id (empty: the remote's default branch). The clone is shallow (the one commit), runs
// in a container of its own and reaches the URL's host through the egress proxy, under policy.
type Git struct {
	URL string `json:"url"`
	Ref string `json:"ref,omitempty"`
}

// Bounds of a git source, far above any real one.
const (
	maxGitURL = 2048
	maxGitRef = 255
)

// Check validates the source and returns the host the clone reaches (lower case, without port or trailing
// dot). Its errors are *Error (invalid_params) whose message says what to change. It refuses anything
// but https:// (ssh needs keys and a channel the egress proxy does not carry; http can be tampered
// with on the way), credentials in the URL (they would be kept in the workspace's .git/config, the call's
// record and the audit log), and refs that git could read as an option or that are not ref names.
func (g Git) Check() (host string, err error) {
	bad := func(format string, a ...any) (string, error) {
		return "", &Error{Type: call.ErrInvalidParams, Msg: fmt.Sprintf(format, a...)}
	}
	raw := g.URL
	switch {
	case raw == "":
		return bad(`the git source has no url: give {"git": {"url": "https://host/owner/repo.git", "ref": "main"}}`)
	case len(raw) > maxGitURL:
		return bad("the git url is %d bytes long: the limit is %d", len(raw), maxGitURL)
	case strings.IndexFunc(raw, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0:
		return bad("the git url %.100q holds a space or a control character: percent-encode it", raw)
	case !strings.Contains(raw, "://"):
		if at := strings.Index(raw, "@"); at >= 0 && strings.Contains(raw[at:], ":") {
			return bad("the git url %.100q is an ssh address (user@host:path), which toolpool does not clone: give the repository's https:// URL", raw)
		}
		return bad("the git url %.100q is not a URL: give the repository's https:// URL (https://host/owner/repo.git)", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("the git url %.100q does not parse: %v", raw, err)
	}
	switch scheme := strings.ToLower(u.Scheme); {
	case scheme == "http":
		return bad("the git url %.100q is plain http, which anyone on the way can change: use https://", raw)
	case scheme != "https":
		return bad("the git url's scheme %q is not cloned (ssh needs keys, git:// and file:// are unauthenticated or local): give the repository's https:// URL", u.Scheme)
	case u.User != nil:
		return bad("the git url carries credentials (user or token before '@'); remove them: they would be kept in the workspace's .git/config, " +
			"in the call's record and in the audit log. For a private repository an operator binds a credential to its host in the worker's " +
			"egress config (egress.credentials), and the egress proxy adds it to each request without the sandbox ever seeing it")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return bad("the git url %.100q has a #fragment: give the ref in \"ref\" instead", raw)
	case u.Opaque != "":
		return bad("the git url %.100q is not of the form https://host/path", raw)
	}
	host = strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "" {
		return bad("the git url %.100q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("the git url's port %q is not a number between 1 and 65535", p)
		}
	}
	if err := checkRef(g.Ref); err != nil {
		return "", err
	}
	return host, nil
}

// IsCommit reports whether the ref is a full commit id (40 or 64 hex digits), which is fetched by id
// rather than cloned by name.
func (g Git) IsCommit() bool {
	if len(g.Ref) != 40 && len(g.Ref) != 64 {
		return false
	}
	return strings.Trim(strings.ToLower(g.Ref), "0123456789abcdef") == ""
}

// checkRef applies git's rules for ref names (git check-ref-format), and refuses a leading '-', which git
// could read as an option.
func checkRef(ref string) error {
	bad := func(why string) error {
		return &Error{Type: call.ErrInvalidParams, Msg: fmt.Sprintf("the git ref %.80q %s: give a branch, a tag or a full commit id (or no ref for the default branch)", ref, why)}
	}
	switch {
	case ref == "":
		return nil
	case len(ref) > maxGitRef:
		return bad(fmt.Sprintf("is %d bytes long, over %d", len(ref), maxGitRef))
	case strings.HasPrefix(ref, "-"):
		return bad("starts with '-', which git would read as an option")
	case strings.IndexFunc(ref, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ' ' }) >= 0:
		return bad("holds a space or a control character")
	case strings.ContainsAny(ref, `~^:?*[\`):
		return bad("holds one of ~ ^ : ? * [ \\, which ref names cannot")
	case strings.Contains(ref, "..") || strings.Contains(ref, "@{") || strings.Contains(ref, "//") || ref == "@":
		return bad(`holds "..", "@{" or "//", or is "@"`)
	case strings.HasPrefix(ref, "/") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".") || strings.HasSuffix(ref, ".lock"):
		return bad("starts or ends with '/', or ends with '.' or \".lock\"")
	}
	for _, part := range strings.Split(ref, "/") {
		if strings.HasPrefix(part, ".") {
			return bad("has a component starting with '.'")
		}
	}
	return nil
}
