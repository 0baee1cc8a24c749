// Limits: the per-workspace quota and the tenant's limits (workspaces, bytes), and how a refusal reads.

package workspace

import (
	"fmt"
	"sort"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// checkQuota refuses adding bytes to workspace name, which uses used, past Config.Quota. The bytes added
// are counted whole, as if no file they replace were freed.
func (m *Manager) checkQuota(name string, used, add int64) error {
	return m.quotaError(name, used, add, "upload less (leave out build outputs and dependencies, or push parts separately after deleting what they replace), or have an operator raise the quota")
}

// checkCopyQuota refuses making workspace name a copy of workspace from (snapshot snap of it, when not
// empty), a tree of size bytes, past Config.Quota: a quota lowered since the tree was made, say.
func (m *Manager) checkCopyQuota(name string, size int64, from, snap string) error {
	fix := fmt.Sprintf("pull workspace %q (GET /v1/workspaces/%s/archive, or toolpool ws pull %s) and push only the part you need into a new workspace, or have an operator raise the quota", from, from, from)
	if snap != "" {
		fix = fmt.Sprintf("snapshot %q of workspace %q was taken under a higher quota and stays as it was; have an operator raise the quota to restore or fork it", snap, from)
	}
	return m.quotaError(name, 0, size, fix)
}

// quotaError is the too_large error of putting add bytes into workspace name, which uses used, past
// Config.Quota (nil when within it); fix says what the caller can do instead.
func (m *Manager) quotaError(name string, used, add int64, fix string) error {
	if m.cfg.Quota <= 0 || used+add <= m.cfg.Quota {
		return nil
	}
	what := fmt.Sprintf("this would put %s into workspace %q", FormatBytes(add), name)
	if used > 0 {
		what = fmt.Sprintf("workspace %q uses %s and this would add %s", name, FormatBytes(used), FormatBytes(add))
	}
	return &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("%s, over the quota of %s a workspace may use (the worker's workspace_quota): %s",
		what, FormatBytes(m.cfg.Quota), fix)}
}

// checkLimits refuses adding workspaces and bytes that would take the tenant past its limits, naming
// what to remove.
func (m *Manager) checkLimits(tenant string, addWorkspaces int, addBytes int64) error {
	if m.cfg.MaxWorkspaces == 0 && m.cfg.MaxBytes == 0 {
		return nil
	}
	names, err := m.names(tenant)
	if err != nil {
		return err
	}
	type use struct {
		name  string
		bytes int64
	}
	var uses []use
	var total int64
	for _, n := range names {
		b, _ := sandbox.DiskUsage(m.wsDir(tenant, n))
		s, _ := sandbox.DiskUsage(m.snapDir(tenant, n))
		uses = append(uses, use{n, b + s})
		total += b + s
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].bytes > uses[j].bytes })
	var largest []string
	for i, u := range uses {
		if i == 5 {
			break
		}
		largest = append(largest, fmt.Sprintf("%s (%s with its snapshots)", u.name, FormatBytes(u.bytes)))
	}
	if addWorkspaces > 0 && m.cfg.MaxWorkspaces > 0 && len(names)+addWorkspaces > m.cfg.MaxWorkspaces {
		return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("tenant %s has %d workspaces, its limit: remove one you no longer need (DELETE /v1/workspaces/{name}, or toolpool ws rm NAME) before creating another; the largest: %s",
			tenant, len(names), strings.Join(largest, ", "))}
	}
	if m.cfg.MaxBytes > 0 && total+addBytes > m.cfg.MaxBytes {
		return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("tenant %s's workspaces and snapshots use %s and this would add %s, over its limit of %s: remove workspaces or snapshots you no longer need (DELETE /v1/workspaces/{name}); the largest: %s",
			tenant, FormatBytes(total), FormatBytes(addBytes), FormatBytes(m.cfg.MaxBytes), strings.Join(largest, ", "))}
	}
	return nil
}

// FormatBytes renders n in the largest binary unit that keeps it at least 1, with one decimal.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// overQuota is the quota_exceeded refusal of a call into workspace name, which uses used bytes, over its
// quota; tooDeep reports that it nests too deep to measure, which counts as over. Calls that could add to
// it must not run; the message says so in words a model can act on.
func overQuota(name string, used, quota int64, tooDeep bool) error {
	if tooDeep {
		return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("workspace %q nests directories deeper than %d levels, so its size cannot be checked against its quota of %s: calls into it are refused until the deep directories are removed",
			name, sandbox.MaxTreeDepth, FormatBytes(quota))}
	}
	return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("workspace %q uses %s, over its quota of %s: calls into it are refused until files are deleted to bring it under the quota, or an operator raises the quota",
		name, FormatBytes(used), FormatBytes(quota))}
}
