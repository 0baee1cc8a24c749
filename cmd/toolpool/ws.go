package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/workspace"
)

const wsUsage = `usage:
  toolpool ws create NAME [--from DIR|ARCHIVE]   a new workspace, empty or seeded (tar, tar.gz, zip)
  toolpool ws create NAME --git URL [--ref REF]  a new workspace cloned from git (https; default branch)
      create's --image REF                       the workspace's default image: its calls that name none run on it
  toolpool ws image NAME REF|--none              change a workspace's default image (--none removes it)
  toolpool ws ls                                 your workspaces: size, files, last use, expiry
  toolpool ws info NAME                          one workspace, with its snapshots
  toolpool ws push NAME DIR|ARCHIVE [--path P]   upload a directory or an archive into path P
  toolpool ws pull NAME [--path P] [-o OUT]      download the tree (or P) as tar.gz (default NAME.tar.gz)
  toolpool ws pull NAME --file F [-o OUT]        download one file (default: standard output)
  toolpool ws snapshot NAME [SNAPSHOT]           save a snapshot
  toolpool ws fork NAME NEW [--snapshot S]       copy a workspace (or its snapshot S) to NEW
  toolpool ws restore NAME SNAPSHOT              bring a snapshot back
  toolpool ws rm NAME                            delete a workspace and its snapshots
`

func cmdWorkspace(c *client, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: name a ws command\n%s", errUsage, wsUsage)
	}
	ctx := context.Background()
	flags, pos := splitFlags(args[1:])
	fs := flag.NewFlagSet("ws "+args[0], flag.ContinueOnError)
	from := fs.String("from", "", "seed from this directory or archive")
	dest := fs.String("path", "", "a path inside the workspace")
	out := fs.String("o", "", "write the download here")
	file := fs.String("file", "", "download this one file")
	snap := fs.String("snapshot", "", "fork this snapshot")
	gitURL := fs.String("git", "", "clone this git repository (https URL)")
	ref := fs.String("ref", "", "the branch, tag or commit to clone (default: the default branch)")
	image := fs.String("image", "", "create: the workspace's default image (an OCI reference policy admits)")
	none := fs.Bool("none", false, "image: remove the workspace's default image")
	if err := parseFlags(fs, flags); err != nil {
		return err
	}
	need := func(n int, what string) error {
		if len(pos) != n {
			return fmt.Errorf("%w: toolpool ws %s %s\n%s", errUsage, args[0], what, wsUsage)
		}
		return nil
	}
	switch args[0] {
	case "create":
		if err := need(1, "NAME"); err != nil {
			return err
		}
		path := "/v1/workspaces/" + url.PathEscape(pos[0])
		if *image != "" {
			path += "?image=" + url.QueryEscape(*image)
		}
		switch {
		case *from != "" && *gitURL != "":
			return fmt.Errorf("%w: give --from or --git, not both\n%s", errUsage, wsUsage)
		case *ref != "" && *gitURL == "":
			return fmt.Errorf("%w: --ref names what to clone: give --git URL too\n%s", errUsage, wsUsage)
		case *gitURL != "":
			src := workspace.Git{URL: *gitURL, Ref: *ref}
			if _, err := src.Check(); err != nil {
				return fmt.Errorf("%w: %w", errUsage, err)
			}
			return c.wsDo(ctx, http.MethodPut, path, map[string]any{"git": src}, stdout)
		}
		if *from == "" {
			return c.wsDo(ctx, http.MethodPut, path, nil, stdout)
		}
		return c.upload(ctx, http.MethodPut, path, *from, stdout, stderr)
	case "image":
		if *none {
			pos = append(pos, "")
		}
		if err := need(2, "NAME REF|--none"); err != nil {
			return err
		}
		return c.wsDo(ctx, http.MethodPatch, "/v1/workspaces/"+url.PathEscape(pos[0]), map[string]any{"image": pos[1]}, stdout)
	case "push":
		if err := need(2, "NAME DIR|ARCHIVE"); err != nil {
			return err
		}
		return c.upload(ctx, http.MethodPost, "/v1/workspaces/"+url.PathEscape(pos[0])+"/files?path="+url.QueryEscape(*dest), pos[1], stdout, stderr)
	case "ls":
		var list struct {
			Workspaces []workspace.Info `json:"workspaces"`
		}
		if _, err := c.do(ctx, http.MethodGet, "/v1/workspaces", nil, &list); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tFILES\tBYTES\tSNAPSHOTS\tLAST USED\tEXPIRES")
		for _, w := range list.Workspaces {
			exp := "never"
			if !w.ExpiresAt.IsZero() {
				exp = w.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", w.Name, w.Files, w.Bytes, len(w.Snapshots), w.LastUsedAt.Format(time.RFC3339), exp)
		}
		return tw.Flush()
	case "info", "rm":
		if err := need(1, "NAME"); err != nil {
			return err
		}
		method := http.MethodGet
		if args[0] == "rm" {
			method = http.MethodDelete
		}
		return c.wsDo(ctx, method, "/v1/workspaces/"+url.PathEscape(pos[0]), nil, stdout)
	case "snapshot", "fork", "restore":
		body := map[string]string{}
		switch args[0] {
		case "snapshot":
			if len(pos) == 2 {
				body["snapshot"] = pos[1]
				pos = pos[:1]
			}
			if err := need(1, "NAME [SNAPSHOT]"); err != nil {
				return err
			}
		case "fork":
			if err := need(2, "NAME NEW [--snapshot S]"); err != nil {
				return err
			}
			body["to"], body["snapshot"] = pos[1], *snap
		case "restore":
			if err := need(2, "NAME SNAPSHOT"); err != nil {
				return err
			}
			body["snapshot"] = pos[1]
		}
		return c.wsDo(ctx, http.MethodPost, "/v1/workspaces/"+url.PathEscape(pos[0])+"/"+args[0], body, stdout)
	case "pull":
		if err := need(1, "NAME"); err != nil {
			return err
		}
		path := "/v1/workspaces/" + url.PathEscape(pos[0]) + "/archive?path=" + url.QueryEscape(*dest)
		target := *out
		if *file != "" {
			path = "/v1/workspaces/" + url.PathEscape(pos[0]) + "/files/" + (&url.URL{Path: *file}).EscapedPath()
		} else if target == "" {
			target = pos[0] + ".tar.gz"
		}
		return c.download(ctx, path, target, stdout)
	}
	return fmt.Errorf("%w: unknown ws command %q\n%s", errUsage, args[0], wsUsage)
}

// wsDo sends a workspace request and prints the answer. An operation policy denied (403, answered with
// its call's envelope) is an error that says why. An operation that waits for a person's approval, or is
// still running, is answered with its call's envelope too: wsDo says what to run next instead.
func (c *client) wsDo(ctx context.Context, method, path string, body any, stdout io.Writer) error {
	var v json.RawMessage
	code, err := c.do(ctx, method, path, body, &v)
	if err != nil {
		return err
	}
	var res call.Result
	if json.Unmarshal(v, &res) != nil || res.ID == "" || res.Status == "" {
		return printWorkspace(stdout, v) // a workspace, not a call's envelope
	}
	switch {
	case code == http.StatusForbidden && res.Error != nil:
		return fmt.Errorf("%s was denied: %s (HTTP 403 %s, call %s)", res.Tool, res.Error.Message, res.Error.Type, res.ID)
	case res.Status == call.StatusPendingApproval:
		why := "policy asks"
		if res.Decision != nil && res.Decision.Reason != "" {
			why = res.Decision.Reason
		}
		_, err := fmt.Fprintf(stdout, "%s waits for a person's approval (%s): an approver runs `toolpool approvals approve %s`; "+
			"`toolpool get %s --wait 1m` then prints the result\n", res.Tool, why, res.ID, res.ID)
		return err
	case !res.Status.Terminal():
		_, err := fmt.Fprintf(stdout, "%s is %s: `toolpool get %s --wait 1m` prints the result\n", res.Tool, res.Status, res.ID)
		return err
	case res.Status != call.StatusOK:
		msg := string(res.Status)
		if res.Error != nil {
			msg = res.Error.Message
		}
		return fmt.Errorf("%s ended %s: %s (call %s)", res.Tool, res.Status, msg, res.ID)
	}
	return printWorkspace(stdout, v)
}

func printWorkspace(w io.Writer, v json.RawMessage) error {
	var pretty any
	if err := json.Unmarshal(v, &pretty); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	b, _ := json.MarshalIndent(pretty, "", "  ")
	_, err := fmt.Fprintln(w, string(b))
	return err
}

// upload sends src (a directory, tarred on the fly, or an archive file as it is) to path. What a
// directory's archive leaves out is noted on stderr.
func (c *client) upload(ctx context.Context, method, path, src string, stdout, stderr io.Writer) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	var body io.Reader
	archived := make(chan error, 1)
	if st.IsDir() {
		pr, pw := io.Pipe()
		go func() {
			err := tarDir(src, pw, func(rel, why string) { fmt.Fprintf(stderr, "toolpool: left out %s: %s\n", rel, why) })
			archived <- err
			pw.CloseWithError(err)
		}()
		body = pr
	} else {
		archived <- nil
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		body = f
	}
	resp, err := c.raw(ctx, method, path, body)
	if err != nil {
		select {
		case aerr := <-archived:
			if aerr != nil {
				return aerr // the request failed because the archive did: say why, not "is it running?"
			}
		default:
		}
		return err
	}
	return printWorkspace(stdout, resp)
}

// tarDir writes the tree under dir as tar.gz: directories, regular files and symlinks as links. A
// symlink that points outside the tree (an absolute path, or up past dir), which the workspace API
// refuses, is left out and reported to leftOut, like sockets, FIFOs and devices, which are left out
// silently.
func tarDir(dir string, w io.Writer, leftOut func(rel, why string)) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
			if filepath.IsAbs(link) || !filepath.IsLocal(filepath.Join(filepath.Dir(rel), link)) {
				leftOut(filepath.ToSlash(rel), fmt.Sprintf("a symlink to %q, outside the directory (a workspace's links must point inside it, relatively)", link))
				return nil
			}
		case !info.Mode().IsRegular() && !info.IsDir():
			return nil // sockets, FIFOs, devices stay behind
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Mode &= 0o777
		if info.Mode().IsRegular() {
			return addFile(tw, p, h)
		}
		return tw.WriteHeader(h)
	})
	if err != nil {
		return fmt.Errorf("archive %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// addFile writes the regular file at p to tw under header h, with the size it has once open: a file that
// grows while the tree is archived (a log being written) goes in as it was when opened, and one that
// shrinks is an error that names it, never a short entry.
func addFile(tw *tar.Writer, p string, h *tar.Header) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return nil // replaced by something else since the walk saw it
	}
	h.Size, h.ModTime = st.Size(), st.ModTime()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if n, err := io.CopyN(tw, f, h.Size); err != nil {
		return fmt.Errorf("%s shrank from %d to %d bytes while it was archived: upload again once it is not being written (%w)", p, h.Size, n, err)
	}
	return nil
}

// raw sends body as is and returns a 2xx response's body.
func (c *client) raw(ctx context.Context, method, path string, body io.Reader) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		return nil, apiErrorOf(resp.StatusCode, data)
	}
	return data, nil
}

// download streams a 200 response's body to target ("" for stdout).
func (c *client) download(ctx context.Context, path, target string, stdout io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return apiErrorOf(resp.StatusCode, data)
	}
	w := stdout
	if target != "" {
		f, err := os.Create(target)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if target != "" {
		fmt.Fprintf(stdout, "wrote %d bytes to %s\n", n, target)
	}
	return nil
}
