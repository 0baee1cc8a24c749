package incontainer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/JohannesKaufmann/html-to-markdown/v2/converter"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/base"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/commonmark"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/strikethrough"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/table"
	"golang.org/x/net/html/charset"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

const (
	webFetchDefaultMaxBytes = 100_000
	// WebFetchMaxBytes is the most text web_fetch returns (its max_bytes argument at most).
	WebFetchMaxBytes = 1_000_000
	// WebFetchDefaultTimeout bounds web_fetch's request when its timeout_ms argument is left out.
	WebFetchDefaultTimeout = 30 * time.Second
	webFetchMaxTimeoutMS   = 120_000
	// webFetchMaxDownload bounds the response body read from the network.
	webFetchMaxDownload = 10 << 20
	// webFetchMaxRedirects is how many redirects web_fetch follows.
	webFetchMaxRedirects = 5
	// webFetchErrorBody is how much of an error page web_fetch shows.
	webFetchErrorBody = 4000
)

type webFetchArgs struct {
	URL       string `json:"url"`
	MaxBytes  IntArg `json:"max_bytes"`
	Offset    IntArg `json:"offset"`
	Raw       bool   `json:"raw"`
	TimeoutMS IntArg `json:"timeout_ms"`
}

// ParseFetchURL accepts absolute http and https URLs with a host.
func ParseFetchURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("is not a valid URL (%v): give an absolute http:// or https:// URL", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("must be an http:// or https:// URL, got %q", raw)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("has no host: give an absolute URL such as https://example.com/page, got %q", raw)
	}
	return u, nil
}

// egressFailure is the proxy's explanation of a refused or failed destination.
type egressFailure struct {
	refused bool
	reason  string
}

func (e *egressFailure) Error() string { return e.reason }

func proxyFailure(h http.Header) error {
	if r := h.Get(egress.RefusedHeader); r != "" {
		return &egressFailure{refused: true, reason: r}
	}
	if r := h.Get(egress.ErrorHeader); r != "" {
		return &egressFailure{reason: r}
	}
	return nil
}

func runWebFetch(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a webFetchArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	u, err := ParseFetchURL(a.URL)
	if err != nil {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "url %v", err)
	}
	maxBytes := a.MaxBytes.Or(webFetchDefaultMaxBytes, WebFetchMaxBytes)
	timeout := WebFetchDefaultTimeout
	if a.TimeoutMS > 0 {
		timeout = time.Duration(min(int64(a.TimeoutMS), webFetchMaxTimeoutMS)) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()

	sock := e.cfg.egressSocket
	transport := &http.Transport{
		// Every request, whatever its host, goes to the egress proxy over the socket.
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress.toolpool"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		TLSClientConfig:     &tls.Config{RootCAs: e.cfg.rootCAs},
		TLSHandshakeTimeout: 15 * time.Second,
		DisableKeepAlives:   true,
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			return proxyFailure(resp.Header)
		},
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{
		Transport: transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > webFetchMaxRedirects {
				return fmt.Errorf("stopped after %d redirects (last to %s)", webFetchMaxRedirects, req.URL)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("refused a redirect to %q: only http and https are fetched", req.URL)
			}
			return nil
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "fetch %s: %v", a.URL, err)
	}
	req.Header.Set("User-Agent", "Mozilla/5.0 (compatible; toolpool-web_fetch/1.0)")
	req.Header.Set("Accept", "text/markdown, text/html;q=0.9, text/plain;q=0.8, application/json;q=0.8, */*;q=0.5")
	resp, err := client.Do(req)
	if err != nil {
		return RunnerResult{}, fetchErr(a.URL, timeout, err)
	}
	defer resp.Body.Close()
	if err := proxyFailure(resp.Header); err != nil && (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusBadGateway) {
		return RunnerResult{}, fetchErr(a.URL, timeout, err)
	}
	final := resp.Request.URL.String()
	body, err := io.ReadAll(io.LimitReader(resp.Body, webFetchMaxDownload+1))
	if err != nil {
		return RunnerResult{}, fetchErr(a.URL, timeout, err)
	}
	downloadCut := len(body) > webFetchMaxDownload
	if downloadCut {
		body = body[:webFetchMaxDownload]
	}

	ctype := resp.Header.Get("Content-Type")
	mediaType, _, _ := mime.ParseMediaType(ctype)
	if mediaType == "" || mediaType == "application/octet-stream" {
		mediaType, _, _ = mime.ParseMediaType(http.DetectContentType(body))
	}
	isHTML := mediaType == "text/html" || mediaType == "application/xhtml+xml"
	_, encName, _ := charset.DetermineEncoding(body, ctype)
	sample := body[:min(len(body), binarySniffBytes)]
	sniffed := bytes.IndexByte(sample, 0) >= 0 && !strings.HasPrefix(encName, "utf-16") ||
		encName == "utf-8" && looksBinary(sample) // a declared legacy charset is trusted
	if !isHTML && !textMedia(mediaType) || sniffed {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "fetch %s: the response is binary (%s, %d bytes) and web_fetch returns only text", final, mediaType, len(body))
	}
	text, err := decodeText(body, ctype)
	if err != nil {
		return RunnerResult{}, fmt.Errorf("fetch %s: decode text: %w", final, err)
	}
	how := ""
	if isHTML && !a.Raw {
		md, err := htmlToMarkdown(ctx, text, final)
		if err != nil {
			return RunnerResult{}, fmt.Errorf("fetch %s: convert HTML to Markdown: %w", final, err)
		}
		text, how = md, ", converted to Markdown"
	}

	header := fmt.Sprintf("URL: %s\nContent-Type: %s%s\n", final, mediaType, how)
	if downloadCut {
		header += fmt.Sprintf("[only the first %d bytes of the response were downloaded]\n", webFetchMaxDownload)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := fmt.Sprintf("fetch %s: HTTP %s", final, resp.Status)
		page := text
		if len(page) > webFetchErrorBody {
			page = cutRunes(page, webFetchErrorBody) + "\n[... page cut]"
		}
		typ := "http_error"
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusGone:
			typ = call.ErrNotFound
		case http.StatusUnauthorized, http.StatusForbidden:
			typ = call.ErrPermissionDenied
		}
		return RunnerResult{
			Output: fmt.Sprintf("%sStatus: %s\n\n%s", header, resp.Status, page),
			Error:  &call.ErrorInfo{Type: typ, Message: msg},
		}, nil
	}

	offset := int(a.Offset)
	if offset > len(text) {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "fetch %s: offset %d is past the end: the text has %d bytes", final, offset, len(text))
	}
	for offset > 0 && offset < len(text) && !utf8.RuneStart(text[offset]) {
		offset++
	}
	rest := text[offset:]
	res := RunnerResult{OutputBytes: int64(len(text))}
	if offset > 0 {
		header += fmt.Sprintf("[starting at byte %d of %d]\n", offset, len(text))
	}
	if len(rest) > maxBytes {
		shown := cutRunes(rest, maxBytes)
		if i := strings.LastIndexByte(shown, '\n'); i > len(shown)*3/4 {
			shown = shown[:i+1]
		}
		next := offset + len(shown)
		res.Output = fmt.Sprintf("%s\n%s\n\n[page cut: showing bytes %d-%d of %d; to read on, call web_fetch with the same url and offset=%d]",
			header, shown, offset, next, len(text), next)
		res.Truncated = true
		return res, nil
	}
	res.Output = header + "\n" + rest
	return res, nil
}

// textMedia reports whether a media type is text web_fetch returns as is.
func textMedia(mt string) bool {
	switch {
	case strings.HasPrefix(mt, "text/"), strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	switch mt {
	case "application/json", "application/xml", "application/javascript", "application/ecmascript",
		"application/x-javascript", "application/yaml", "application/x-yaml", "application/toml",
		"application/x-sh", "application/sql", "application/graphql", "application/x-ndjson":
		return true
	}
	return false
}

// decodeText converts body to UTF-8 from the charset its Content-Type (or, for HTML, a meta tag) declares.
func decodeText(body []byte, contentType string) (string, error) {
	enc, name, _ := charset.DetermineEncoding(body, contentType)
	if name == "utf-8" || enc == nil {
		return strings.ToValidUTF8(string(body), "\uFFFD"), nil
	}
	out, err := enc.NewDecoder().Bytes(body)
	if err != nil {
		return "", fmt.Errorf("decode %s: %w", name, err)
	}
	return string(out), nil
}

func htmlToMarkdown(ctx context.Context, page, pageURL string) (string, error) {
	conv := converter.NewConverter(converter.WithPlugins(
		base.NewBasePlugin(), commonmark.NewCommonmarkPlugin(), table.NewTablePlugin(), strikethrough.NewStrikethroughPlugin(),
	))
	md, err := conv.ConvertReader(bytes.NewReader([]byte(page)), converter.WithContext(ctx), converter.WithDomain(pageURL))
	if err != nil {
		return "", err
	}
	return string(md), nil
}

// cutRunes returns at most n bytes of s, cut on a rune boundary.
func cutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// fetchErr explains a failed request to the model.
func fetchErr(rawURL string, timeout time.Duration, err error) error {
	var ef *egressFailure
	if errors.As(err, &ef) {
		if ef.refused {
			return toolErr(call.ErrPolicyDenied, "fetch %s: the egress proxy refused the destination: %s", rawURL, ef.reason)
		}
		return toolErr("network_error", "fetch %s: the egress proxy could not reach it: %s", rawURL, ef.reason)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return toolErr(call.ErrTimeout, "fetch %s: no complete answer within %s: try again, or raise timeout_ms", rawURL, timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Timeout() {
		return toolErr(call.ErrTimeout, "fetch %s: no complete answer within %s: try again, or raise timeout_ms", rawURL, timeout)
	}
	if errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "redirect") {
		return toolErr(call.ErrInvalidParams, "fetch %s: %v", rawURL, ue.Err)
	}
	return toolErr("network_error", "fetch %s: %v", rawURL, err)
}

// withRootCAs makes web_fetch trust pool instead of the system's roots (tests).
func withRootCAs(pool *x509.CertPool) RunnerOption {
	return func(c *runnerConfig) { c.rootCAs = pool }
}
