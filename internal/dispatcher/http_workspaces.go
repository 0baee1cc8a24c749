package dispatcher

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/workspace"
)

// The handlers of the workspace API (/v1/workspaces/...), over runWorkspaceOp (workspaces.go). Uploads
// are stored in the transfer store before their operation is queued; downloads are streamed from it.

func (s *api) routeWorkspaces(mux *http.ServeMux) {
	mux.Handle("GET /v1/workspaces", s.auth(s.listWorkspaces))
	mux.Handle("PUT /v1/workspaces/{name}", s.auth(s.createWorkspace))
	mux.Handle("GET /v1/workspaces/{name}", s.auth(s.simpleWorkspaceOp(workspace.OpInfo)))
	mux.Handle("DELETE /v1/workspaces/{name}", s.auth(s.simpleWorkspaceOp(workspace.OpDelete)))
	mux.Handle("PATCH /v1/workspaces/{name}", s.auth(s.setWorkspaceImage))
	mux.Handle("POST /v1/workspaces/{name}/files", s.auth(s.uploadArchive))
	mux.Handle("PUT /v1/workspaces/{name}/files/{path...}", s.auth(s.uploadFile))
	mux.Handle("GET /v1/workspaces/{name}/files/{path...}", s.auth(s.downloadFile))
	mux.Handle("GET /v1/workspaces/{name}/archive", s.auth(s.downloadArchive))
	mux.Handle("POST /v1/workspaces/{name}/snapshot", s.auth(s.branchWorkspace(workspace.OpSnapshot)))
	mux.Handle("POST /v1/workspaces/{name}/fork", s.auth(s.branchWorkspace(workspace.OpFork)))
	mux.Handle("POST /v1/workspaces/{name}/restore", s.auth(s.branchWorkspace(workspace.OpRestore)))
}

// workspaceOp runs operation op on workspace ws for the request's caller (runWorkspaceOp). It answers the
// request itself (and returns a nil Output, with the call's result when there is one) unless the
// operation ran and succeeded. An operation that is queued but not recorded yet comes with its queued
// result, and one that may have been queued (its state unknown) with a result of StatusUnknown: neither
// is over, and what it consumes (an upload) must be left to it.
func (s *api) workspaceOp(w http.ResponseWriter, r *http.Request, op, ws string, args workspace.Args) (*call.Result, *workspace.Output) {
	res, out, err := s.runWorkspaceOp(r.Context(), principalFrom(r.Context()), op, ws, args)
	var rej *call.Rejection
	switch {
	case errors.Is(err, errNotRecorded):
		writeResult(w, res)
		return res, nil
	case errors.As(err, &rej) && rej.Call != "" && res == nil:
		writeErr(w, err)
		return &call.Result{ID: rej.Call, Status: call.StatusUnknown}, nil
	case err != nil:
		writeErr(w, err)
	case out == nil:
		s.writeCall(r.Context(), w, res) // pending approval, denied, still running, cancelled, expired
	}
	return res, out
}

// workspaceName reads and checks the {name} of the path; it answers the refusal itself when bad.
func workspaceName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if err := call.ValidateName("workspace", name); err != nil {
		writeErr(w, invalid("%v", err))
		return "", false
	}
	return name, true
}

// writeWorkspace answers with one workspace's description.
func writeWorkspace(w http.ResponseWriter, code int, res *call.Result, out *workspace.Output) {
	writeJSON(w, code, map[string]any{"workspace": out.Workspace, "call_id": res.ID})
}

func (s *api) listWorkspaces(w http.ResponseWriter, r *http.Request) {
	res, out := s.workspaceOp(w, r, workspace.OpList, "default", workspace.Args{})
	if out == nil {
		return
	}
	if out.Workspaces == nil {
		out.Workspaces = []workspace.Info{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"workspaces": out.Workspaces, "call_id": res.ID})
}

func (s *api) simpleWorkspaceOp(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, ok := workspaceName(w, r)
		if !ok {
			return
		}
		res, out := s.workspaceOp(w, r, op, name, workspace.Args{})
		if out == nil {
			return
		}
		if op == workspace.OpDelete {
			writeJSON(w, http.StatusOK, map[string]any{"deleted": name, "call_id": res.ID})
			return
		}
		writeWorkspace(w, http.StatusOK, res, out)
	}
}

// createWorkspace: PUT /v1/workspaces/{name}, with no body (empty), an archive (tar, tar.gz, zip), or
// with Content-Type application/json a git source, {"git": {"url": URL, "ref": REF}} (workspace_clone),
// and/or a default image, {"image": REF}. An archive or empty body takes the image as ?image=REF. The
// image is checked against policy's images sections here, before anything is queued.
func (s *api) createWorkspace(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	op := workspace.OpCreate
	args := workspace.Args{Image: r.URL.Query().Get("image")}
	if !s.imageAllowed(w, r, args.Image) {
		return
	}
	switch mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); {
	case r.ContentLength == 0:
	case mt == "application/json":
		src, ok := s.jsonSource(w, r)
		if !ok {
			return
		}
		if src.Image != "" {
			if args.Image != "" {
				writeErr(w, invalid(`the image is given twice, in the body and as ?image=: give it once`))
				return
			}
			if !s.imageAllowed(w, r, src.Image) {
				return
			}
			args.Image = src.Image
		}
		if src.Git != nil {
			op, args.Git = workspace.OpClone, src.Git
		}
	default:
		body := bufio.NewReader(r.Body)
		if b, err := body.Peek(1); err == nil && b[0] == '{' {
			writeErr(w, call.Reject(call.KindUnsupportedMedia, call.ErrInvalidRequest, `the body looks like JSON: to seed from git or set the image, send {"git": {"url": ..., "ref": ...}, "image": ...} with Content-Type: application/json; to seed from an archive, send a tar, tar.gz or zip`))
			return
		}
		obj, ok := s.storeUpload(w, r, body)
		if !ok {
			return
		}
		args.Archive = obj
	}
	res, out := s.workspaceOp(w, r, op, name, args)
	if out == nil {
		s.dropUpload(r.Context(), args.Archive, res)
		return
	}
	writeWorkspace(w, http.StatusCreated, res, out)
}

// imageAllowed checks a workspace's default image ref against policy's images sections of the layers
// and the tenant (a tool's own section governs only the images calls ask for); it answers the refusal
// itself (403, 422) when policy does not admit it.
func (s *api) imageAllowed(w http.ResponseWriter, r *http.Request, ref string) bool {
	if err := s.checkImage(principalFrom(r.Context()).tenant, "", `"image"`, ref); err != nil {
		writeErr(w, err)
		return false
	}
	return true
}

// workspaceSource is the JSON body of PUT /v1/workspaces/{name}: a git source, a default image, or both.
type workspaceSource struct {
	Git   *workspace.Git `json:"git"`
	Image string         `json:"image"`
}

// jsonSource reads and checks the JSON body of a create from git or with an image; it answers the refusal
// itself when bad.
func (s *api) jsonSource(w http.ResponseWriter, r *http.Request) (workspaceSource, bool) {
	const shape = `{"git": {"url": "https://host/owner/repo.git", "ref": "main"}, "image": "registry/repository:tag"} (ref optional: the default branch; git, image or both)`
	var body workspaceSource
	if !s.decodeStrict(w, r, &body, "a workspace source", shape) {
		return body, false
	}
	if body.Git == nil && body.Image == "" {
		writeErr(w, invalid("the JSON body names no git source and no image: send %s", shape))
		return body, false
	}
	if body.Git != nil {
		if _, err := body.Git.Check(); err != nil {
			writeErr(w, invalid("%v", err))
			return body, false
		}
	}
	return body, true
}

// decodeStrict decodes r's body (at most MaxBodyBytes) into v: exactly one JSON object, no field v does not
// have. It answers the refusal itself (400, naming what the body should be, what, and its shape) when bad.
func (s *api) decodeStrict(w http.ResponseWriter, r *http.Request, v any, what, shape string) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		why := describeJSONError(err)
		if msg, unknown := strings.CutPrefix(err.Error(), "json: "); unknown && strings.HasPrefix(msg, "unknown field") {
			why = msg
		}
		writeErr(w, invalid("the body is not %s: %s; send %s", what, why, shape))
		return false
	}
	if dec.More() {
		writeErr(w, invalid("the body has data after the JSON object: send exactly %s", shape))
		return false
	}
	return true
}

// setWorkspaceImage: PATCH /v1/workspaces/{name} with {"image": REF} changes an existing workspace's
// default image; {"image": ""} removes it (its calls then run on the tenant's or the worker's default).
// A new image is checked against policy's images sections here, as at create, before anything is
// queued. The operation (workspace_set_image) waits for the calls running in the workspace to end, so
// that each call runs on one image; calls queued after it run on the new one.
func (s *api) setWorkspaceImage(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	const shape = `{"image": "registry/repository:tag"} ("" removes the workspace's default image)`
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeErr(w, call.Reject(call.KindUnsupportedMedia, call.ErrInvalidRequest, "send the workspace's new default image as JSON, "+shape+", with Content-Type: application/json"))
		return
	}
	var body struct {
		Image *string `json:"image"`
	}
	if !s.decodeStrict(w, r, &body, "a workspace image change", shape) {
		return
	}
	if body.Image == nil {
		writeErr(w, invalid("the JSON body names no image: send %s", shape))
		return
	}
	if !s.imageAllowed(w, r, *body.Image) {
		return
	}
	res, out := s.workspaceOp(w, r, workspace.OpSetImage, name, workspace.Args{Image: *body.Image})
	if out == nil {
		return
	}
	writeWorkspace(w, http.StatusOK, res, out)
}

// uploadArchive: POST /v1/workspaces/{name}/files?path=DIR with an archive as the body.
func (s *api) uploadArchive(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	if r.ContentLength == 0 {
		writeErr(w, invalid("send a tar, tar.gz or zip archive as the body (or PUT one file to /v1/workspaces/%s/files/PATH)", name))
		return
	}
	obj, ok := s.storeUpload(w, r, r.Body)
	if !ok {
		return
	}
	args := workspace.Args{Archive: obj, Path: r.URL.Query().Get("path")}
	res, out := s.workspaceOp(w, r, workspace.OpUpload, name, args)
	if out == nil {
		s.dropUpload(r.Context(), obj, res)
		return
	}
	writeWorkspace(w, http.StatusOK, res, out)
}

// uploadFile: PUT /v1/workspaces/{name}/files/{path} with the file's bytes as the body (Content-Length
// required). It travels as a one-entry archive, under the same checks.
func (s *api) uploadFile(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	p := strings.Trim(r.PathValue("path"), "/")
	if r.ContentLength < 0 {
		writeErr(w, call.Reject(call.KindLengthRequired, call.ErrInvalidRequest, "send the file with a Content-Length header (not chunked)"))
		return
	}
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: r.ContentLength, ModTime: s.now()})
		if err == nil {
			_, err = io.CopyN(tw, r.Body, r.ContentLength)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	obj, ok := s.storeUpload(w, r, pr)
	pr.Close()
	if !ok {
		return
	}
	res, out := s.workspaceOp(w, r, workspace.OpUpload, name, workspace.Args{Archive: obj})
	if out == nil {
		s.dropUpload(r.Context(), obj, res)
		return
	}
	writeWorkspace(w, http.StatusOK, res, out)
}

// storeUpload streams an upload into the transfer store, bounded by MaxUploadBytes, and returns its name.
func (s *api) storeUpload(w http.ResponseWriter, r *http.Request, body io.Reader) (string, bool) {
	if s.transfers == nil {
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "this dispatcher has no transfer store for uploads"))
		return "", false
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		writeErr(w, call.Reject(call.KindTooLarge, call.ErrTooLarge, fmt.Sprintf("the upload is %d bytes, over the %d-byte limit: upload it in parts, into several paths", r.ContentLength, s.cfg.MaxUploadBytes)))
		return "", false
	}
	name := "upload/" + call.NewID()
	limited := &io.LimitedReader{R: body, N: s.cfg.MaxUploadBytes + 1}
	n, err := s.transfers.PutOutput(r.Context(), name, limited)
	switch {
	case err != nil:
		_ = s.transfers.DeleteOutput(context.WithoutCancel(r.Context()), name)
		s.log.ErrorContext(r.Context(), "store upload", "error", err)
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not store the upload; nothing was written: retry"))
		return "", false
	case n > s.cfg.MaxUploadBytes:
		_ = s.transfers.DeleteOutput(context.WithoutCancel(r.Context()), name)
		writeErr(w, call.Reject(call.KindTooLarge, call.ErrTooLarge, fmt.Sprintf("the upload is over the %d-byte limit; nothing was written: upload it in parts, into several paths", s.cfg.MaxUploadBytes)))
		return "", false
	}
	return name, true
}

// dropUpload deletes the upload of an operation that is over without success (refused, denied, failed;
// the worker deletes what it consumed, and a second delete is harmless); one that waits for approval,
// is queued or runs still, or may have been queued (its state unknown), is the worker's to delete.
func (s *api) dropUpload(ctx context.Context, name string, res *call.Result) {
	if name == "" || (res != nil && !res.Status.Terminal()) {
		return
	}
	_ = s.transfers.DeleteOutput(context.WithoutCancel(ctx), name)
}

// branchWorkspace: POST .../snapshot {"snapshot": NAME}, .../fork {"to": NAME, "snapshot": optional},
// .../restore {"snapshot": NAME}.
func (s *api) branchWorkspace(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, ok := workspaceName(w, r)
		if !ok {
			return
		}
		var body struct {
			Snapshot string `json:"snapshot"`
			To       string `json:"to"`
		}
		if r.ContentLength != 0 {
			if err := s.decodeBody(w, r, &body); err != nil {
				writeErr(w, err)
				return
			}
		}
		switch {
		case op == workspace.OpSnapshot && body.Snapshot == "":
			body.Snapshot = "snap-" + s.now().UTC().Format("20060102-150405")
		case op == workspace.OpRestore && body.Snapshot == "":
			writeErr(w, invalid(`name the snapshot to restore: {"snapshot": "NAME"} (GET /v1/workspaces/%s lists them)`, name))
			return
		case op == workspace.OpFork && body.To == "":
			writeErr(w, invalid(`name the new workspace: {"to": "NAME"}, and optionally {"snapshot": "NAME"} to fork a snapshot`))
			return
		}
		for what, v := range map[string]string{"snapshot": body.Snapshot, "to": body.To} {
			if v != "" {
				if err := call.ValidateName(what, v); err != nil {
					writeErr(w, invalid("%v", err))
					return
				}
			}
		}
		res, out := s.workspaceOp(w, r, op, name, workspace.Args{Snapshot: body.Snapshot, To: body.To})
		if out == nil {
			return
		}
		code := http.StatusOK
		if op != workspace.OpRestore {
			code = http.StatusCreated
		}
		writeWorkspace(w, code, res, out)
	}
}

// downloadFile: GET /v1/workspaces/{name}/files/{path}, the file's bytes; one range of "Range: bytes=" is
// honoured (206), several are answered with the whole file.
func (s *api) downloadFile(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	args := workspace.Args{Path: r.PathValue("path"), Length: -1}
	ranged := false
	if h := r.Header.Get("Range"); h != "" {
		off, length, ok := parseRange(h)
		if !ok {
			writeErr(w, call.Reject(call.KindRangeNotSatisfiable, call.ErrInvalidRequest, fmt.Sprintf("the Range header %q is not one range of the form bytes=START-END, bytes=START- or bytes=-SUFFIX", h)))
			return
		}
		if off != 0 || length != -1 {
			args.Offset, args.Length, ranged = off, length, true
		}
	}
	_, out := s.workspaceOp(w, r, workspace.OpReadFile, name, args)
	if out == nil {
		return
	}
	if ranged && args.Offset >= 0 && out.Offset >= out.FileBytes && out.FileBytes > 0 {
		s.dropObject(r.Context(), out.Object)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", out.FileBytes))
		writeErr(w, call.Reject(call.KindRangeNotSatisfiable, call.ErrInvalidRequest, fmt.Sprintf("the range starts at or after the end of the %d-byte file", out.FileBytes)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Accept-Ranges", "bytes")
	code := http.StatusOK
	if ranged {
		code = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", out.Offset, out.Offset+out.ObjectBytes-1, out.FileBytes))
	}
	s.streamObject(w, r, out, code)
}

// parseRange parses one "bytes=" range into an offset and a length (-1: to the end); a suffix range
// "bytes=-N" is offset -N.
func parseRange(h string) (off, length int64, ok bool) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false
	}
	if first == "" {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false
		}
		return -n, -1, true
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false
	}
	if last == "" {
		return start, -1, true
	}
	end, err := strconv.ParseInt(last, 10, 64)
	if err != nil || end < start {
		return 0, 0, false
	}
	return start, end - start + 1, true
}

// downloadArchive: GET /v1/workspaces/{name}/archive?path=DIR, the tree as tar.gz.
func (s *api) downloadArchive(w http.ResponseWriter, r *http.Request) {
	name, ok := workspaceName(w, r)
	if !ok {
		return
	}
	_, out := s.workspaceOp(w, r, workspace.OpArchive, name, workspace.Args{Path: r.URL.Query().Get("path")})
	if out == nil {
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s.tar.gz"`, name))
	s.streamObject(w, r, out, http.StatusOK)
}

// streamObject copies a download from the transfer store to the client, then deletes it.
func (s *api) streamObject(w http.ResponseWriter, r *http.Request, out *workspace.Output, code int) {
	defer s.dropObject(r.Context(), out.Object)
	if s.transfers == nil {
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "this dispatcher has no transfer store for downloads"))
		return
	}
	rc, err := s.transfers.OpenOutput(r.Context(), out.Object, 0)
	if err != nil {
		s.log.ErrorContext(r.Context(), "open download", "object", out.Object, "error", err)
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not read the download back; retry"))
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Length", strconv.FormatInt(out.ObjectBytes, 10))
	w.WriteHeader(code)
	if _, err := io.Copy(w, rc); err != nil && !errors.Is(err, context.Canceled) {
		s.log.WarnContext(r.Context(), "stream download", "object", out.Object, "error", err)
	}
}

func (s *api) dropObject(ctx context.Context, name string) {
	if s.transfers != nil && name != "" {
		_ = s.transfers.DeleteOutput(context.WithoutCancel(ctx), name)
	}
}
