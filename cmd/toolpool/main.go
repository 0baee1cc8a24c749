// Command toolpool is the command-line client of a toolpool dispatcher.
//
//	toolpool call TOOL [--workspace WS] [--json] [--timeout 30s] [--no-wait] [key=value | key:=json]...
//	toolpool call TOOL --follow ...          (prints output as it is printed)
//	toolpool get ID [--wait 30s] [--json]
//	toolpool follow ID [--from EVENT_ID]
//	toolpool output ID [--stderr] [--offset N] [--limit N]
//	toolpool cancel ID
//	toolpool tools [--format native|openai|anthropic|mcp]
//	toolpool policy check TOOL [key=value | key:=json]...
//	toolpool ws create|image|ls|info|push|pull|snapshot|fork|restore|rm ...
//
// It reads the dispatcher's address from $TOOLPOOL_URL (default http://127.0.0.1:8080) and the bearer
// token from $TOOLPOOL_TOKEN (default dev).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
)

const usage = `toolpool: run AI agents' tool calls in sandboxes.

usage:
  toolpool call TOOL [flags] [key=value | key:=json]...   run a tool call and print its result
      --follow: print the output live as it is printed (Server-Sent Events), then the result
  toolpool get ID [--wait 30s] [--json]                    print a call's state or result
  toolpool follow ID                                      follow a call live: output as printed, then result
  toolpool output ID [--stderr] [--offset N] [--limit N]  a finished call's full stdout (or stderr), by range
  toolpool cancel ID                                      cancel a queued or running call
  toolpool tools [--format native|openai|anthropic|mcp]   list the tools you may call
  toolpool policy check TOOL [key=value | key:=json]...   what policy decides, without running
  toolpool approvals                                      calls waiting for approval (approver token)
  toolpool approvals approve ID [--always --prefix 'git push']   approve one (and, with --always, like it)
  toolpool approvals deny ID [--reason TEXT]              deny one (the reason is told to the caller)
  toolpool audit [--since 1h] [--limit N] [--json]        the tenant's audit log
  toolpool ws create|image|ls|info|push|pull|snapshot|fork|restore|rm ...
                                                          manage workspaces (toolpool ws for details)
  toolpool bench [--concurrency 4] [--rate R] [--duration 30s] [--mix shell=8,list=1]
                                                          load test: throughput, latency, final states

Arguments: key=value passes a string; key:=value passes raw JSON (numbers, booleans, arrays).
  toolpool call run_shell command='ls -la'
  toolpool call read_file path=README.md limit:=20

Environment: TOOLPOOL_URL (default http://127.0.0.1:8080), TOOLPOOL_TOKEN (default dev).

Exit status: call, get and follow exit with the tool's own exit code when it ran and failed, 0 when the
call ended ok (or is not final yet), 1 when it ended otherwise; cancel exits 0 when the call ends
cancelled or is being stopped, 1 when it had already ended; a request the API refused or could not take
exits 1; a bad command, argument or flag exits 2.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	c := newClient()
	var err error
	code := 0
	switch args[0] {
	case "call":
		code, err = cmdCall(c, args[1:], stdout, stderr)
	case "get":
		code, err = cmdGet(c, args[1:], stdout, stderr)
	case "follow":
		code, err = cmdFollow(c, args[1:], stdout, stderr)
	case "output":
		code, err = cmdOutput(c, args[1:], stdout, stderr)
	case "cancel":
		code, err = cmdCancel(c, args[1:], stdout, stderr)
	case "tools":
		err = cmdTools(c, args[1:], stdout)
	case "policy":
		err = cmdPolicy(c, args[1:], stdout)
	case "approvals":
		err = cmdApprovals(c, args[1:], stdout)
	case "audit":
		err = cmdAudit(c, args[1:], stdout)
	case "bench":
		err = cmdBench(c, args[1:], stdout)
	case "ws":
		err = cmdWorkspace(c, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "toolpool: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case errors.Is(err, flag.ErrHelp): // the command's flags were printed, as asked
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "toolpool:", err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return code
}

var errUsage = errors.New("usage")

// parseFlags parses args into fs. A flag it does not know or cannot read is a usage error (exit 2), like a
// missing argument, whichever command it was given to.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}

type client struct {
	base  string
	token string
	http  *http.Client
}

func newClient() *client {
	base := os.Getenv("TOOLPOOL_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	token := os.Getenv("TOOLPOOL_TOKEN")
	if token == "" {
		token = "dev"
	}
	return &client{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{}}
}

// send sends req with the client's token; an error means the dispatcher could not be reached. The caller
// closes the response's body.
func (c *client) send(req *http.Request) (*http.Response, error) {
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach dispatcher at %s (is it running? set TOOLPOOL_URL): %w", c.base, err)
	}
	return resp, nil
}

// apiErrorOf is the error an API answer with status code and body data stands for: the API's message.
func apiErrorOf(code int, data []byte) error {
	var ae struct {
		Error call.ErrorInfo `json:"error"`
	}
	if json.Unmarshal(data, &ae) == nil && ae.Error.Message != "" {
		return &httpError{code: code, msg: fmt.Sprintf("%s (HTTP %d %s)", ae.Error.Message, code, ae.Error.Type)}
	}
	return &httpError{code: code, msg: fmt.Sprintf("HTTP %d: %s", code, strings.TrimSpace(string(data)))}
}

// do sends a request and decodes a 2xx body, or a 403 that carries a result envelope (a call denied by
// policy), into out; other statuses become errors with the API's message.
func (c *client) do(ctx context.Context, method, path string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 && (resp.StatusCode != http.StatusForbidden || !isResult(data)) {
		return resp.StatusCode, apiErrorOf(resp.StatusCode, data)
	}
	if out != nil {
		if raw, ok := out.(*json.RawMessage); ok {
			*raw = data
			return resp.StatusCode, nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode response: %w", err)
		}
	}
	return resp.StatusCode, nil
}

// isResult reports whether data is a result envelope rather than an error body.
func isResult(data []byte) bool {
	var r struct {
		ID     string      `json:"id"`
		Status call.Status `json:"status"`
	}
	return json.Unmarshal(data, &r) == nil && r.ID != "" && r.Status != ""
}

// parseArgs turns key=value (string) and key:=json pairs into a JSON object.
func parseArgs(pairs []string) (json.RawMessage, error) {
	args := map[string]json.RawMessage{}
	for _, p := range pairs {
		if k, v, ok := strings.Cut(p, ":="); ok && !strings.Contains(k, "=") {
			if !json.Valid([]byte(v)) {
				return nil, fmt.Errorf("%w: %s: the value after := must be JSON (quote strings, or use key=value)", errUsage, p)
			}
			args[k] = json.RawMessage(v)
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: argument %q is not key=value or key:=json", errUsage, p)
		}
		b, _ := json.Marshal(v)
		args[k] = b
	}
	return json.Marshal(args)
}

// splitFlags separates flags (which may come after the positional arguments) from key=value pairs.
func splitFlags(args []string) (flags, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
			if !strings.Contains(a, "=") && i+1 < len(args) && !isBoolFlag(a) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		rest = append(rest, a)
	}
	return flags, rest
}

func isBoolFlag(a string) bool {
	switch strings.TrimLeft(a, "-") {
	case "json", "no-wait", "follow", "stderr":
		return true
	}
	return false
}

func cmdCall(c *client, args []string, stdout, stderr io.Writer) (int, error) {
	// Flags may come before TOOL too (toolpool call --follow run_shell ...).
	var lead []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		n := 1
		if !isBoolFlag(args[0]) && !strings.Contains(args[0], "=") {
			n = 2
		}
		n = min(n, len(args))
		lead, args = append(lead, args[:n]...), args[n:]
	}
	if len(args) == 0 {
		return 2, fmt.Errorf("%w: toolpool call TOOL [--workspace WS] [--follow] [--json] [--no-wait] [--timeout D] [key=value | key:=json]...", errUsage)
	}
	tool := args[0]
	flagArgs, pairs := splitFlags(args[1:])
	flagArgs = append(lead, flagArgs...)
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ws := fs.String("workspace", "default", "workspace name")
	asJSON := fs.Bool("json", false, "print the result envelope as JSON")
	timeout := fs.Duration("timeout", 0, "call timeout (default: the tool's)")
	noWait := fs.Bool("no-wait", false, "return the call id at once")
	rawArgs := fs.String("args", "", "the arguments as one JSON object (instead of key=value pairs)")
	key := fs.String("idempotency-key", "", "retrying with the same key returns the same call")
	follow := fs.Bool("follow", false, "print the output as it is printed, then the result")
	if err := parseFlags(fs, flagArgs); err != nil {
		return 2, err
	}
	var argsJSON json.RawMessage
	var err error
	if *rawArgs != "" {
		if len(pairs) > 0 {
			return 2, fmt.Errorf("%w: give --args or key=value pairs, not both", errUsage)
		}
		argsJSON = json.RawMessage(*rawArgs)
	} else if argsJSON, err = parseArgs(pairs); err != nil {
		return 2, err
	}
	body := map[string]any{"tool": tool, "args": argsJSON, "workspace": *ws}
	if *timeout > 0 {
		body["timeout_ms"] = timeout.Milliseconds()
	}
	if *noWait {
		body["wait"] = false
	}
	if *key != "" {
		body["idempotency_key"] = *key
	}
	if *follow {
		return callFollow(c, body, *asJSON, stdout, stderr)
	}
	var res call.Result
	var raw json.RawMessage
	if _, err := c.do(context.Background(), http.MethodPost, "/v1/calls", body, &raw); err != nil {
		return 1, err
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return 1, fmt.Errorf("decode result: %w", err)
	}
	// A long call may outlast one request's wait: keep polling until it is final.
	for !*noWait && (res.Status == call.StatusQueued || res.Status == call.StatusRunning) {
		if _, err := c.do(context.Background(), http.MethodGet, "/v1/calls/"+res.ID+"?wait=60s", nil, &raw); err != nil {
			return 1, err
		}
		if err := json.Unmarshal(raw, &res); err != nil {
			return 1, fmt.Errorf("decode result: %w", err)
		}
	}
	return printResult(&res, raw, *asJSON, stdout, stderr), nil
}

// printResult prints a result for a person (output, then a summary line on stderr) or as JSON, and returns
// the exit code: the tool's own for run_shell, 0 for ok, 1 for other final statuses, 0 while pending.
func printResult(res *call.Result, raw json.RawMessage, asJSON bool, stdout, stderr io.Writer) int {
	if asJSON {
		var buf bytes.Buffer
		if json.Indent(&buf, raw, "", "  ") == nil {
			buf.WriteByte('\n')
			stdout.Write(buf.Bytes())
		} else {
			stdout.Write(raw)
		}
	} else {
		out := res.Output
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		fmt.Fprint(stdout, out)
		summary := []string{string(res.Status)}
		if res.ExitCode != nil {
			summary = append(summary, fmt.Sprintf("exit %d", *res.ExitCode))
		}
		if res.Error != nil && res.Status != call.StatusOK && !strings.Contains(res.Output, res.Error.Message) {
			summary = append(summary, res.Error.Type+": "+res.Error.Message)
		} else if res.Error != nil {
			summary = append(summary, res.Error.Type)
		}
		if res.Decision != nil && res.Decision.Action != "allow" {
			summary = append(summary, "policy "+res.Decision.Action+" ("+res.Decision.Rule+")")
		}
		if res.Timing.TotalMS > 0 {
			summary = append(summary, fmt.Sprintf("%d ms", res.Timing.TotalMS))
		}
		summary = append(summary, res.ID)
		fmt.Fprintf(stderr, "[%s]\n", strings.Join(summary, " · "))
	}
	switch {
	case res.ExitCode != nil && res.Status == call.StatusError && res.Error != nil && res.Error.Type == call.ErrExitCode:
		return *res.ExitCode
	case res.Status == call.StatusOK, !res.Status.Terminal():
		return 0
	}
	return 1
}

func cmdGet(c *client, args []string, stdout, stderr io.Writer) (int, error) {
	flagArgs, rest := splitFlags(args)
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	wait := fs.Duration("wait", 0, "long-poll up to this long for the final result")
	asJSON := fs.Bool("json", false, "print the envelope as JSON")
	if err := parseFlags(fs, flagArgs); err != nil {
		return 2, err
	}
	if len(rest) != 1 {
		return 2, fmt.Errorf("%w: toolpool get ID [--wait 30s] [--json]", errUsage)
	}
	path := "/v1/calls/" + rest[0]
	if *wait > 0 {
		path += "?wait=" + wait.String()
	}
	var raw json.RawMessage
	if _, err := c.do(context.Background(), http.MethodGet, path, nil, &raw); err != nil {
		return 1, err
	}
	var res call.Result
	if err := json.Unmarshal(raw, &res); err != nil {
		return 1, fmt.Errorf("decode result: %w", err)
	}
	return printResult(&res, raw, *asJSON, stdout, stderr), nil
}

func cmdCancel(c *client, args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) != 1 {
		return 2, fmt.Errorf("%w: toolpool cancel ID", errUsage)
	}
	var raw json.RawMessage
	if _, err := c.do(context.Background(), http.MethodDelete, "/v1/calls/"+args[0], nil, &raw); err != nil {
		return 1, err
	}
	var res call.Result
	if err := json.Unmarshal(raw, &res); err != nil {
		return 1, fmt.Errorf("decode result: %w", err)
	}
	printResult(&res, raw, false, stdout, stderr)
	// The cancel did what was asked when the call ends cancelled or is still being stopped; a call that had
	// already ended otherwise was not cancelled.
	if res.Status == call.StatusCancelled || !res.Status.Terminal() {
		return 0, nil
	}
	return 1, fmt.Errorf("call %s had already ended %s: nothing was cancelled", res.ID, res.Status)
}

func cmdTools(c *client, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("tools", flag.ContinueOnError)
	format := fs.String("format", "", "native (default: a table), openai, anthropic or mcp (JSON)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	path := "/v1/tools"
	if *format != "" {
		path += "?format=" + *format
	}
	var raw json.RawMessage
	if _, err := c.do(context.Background(), http.MethodGet, path, nil, &raw); err != nil {
		return err
	}
	if *format != "" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("format response: %w", err)
		}
		fmt.Fprintln(stdout, buf.String())
		return nil
	}
	var list struct {
		Tools []struct {
			Name        string `json:"name"`
			Kind        string `json:"kind"`
			Description string `json:"description"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("decode tools: %w", err)
	}
	for _, t := range list.Tools {
		desc, _, _ := strings.Cut(t.Description, "\n")
		if len(desc) > 90 {
			desc = desc[:87] + "..."
		}
		fmt.Fprintf(stdout, "%-12s %-8s %s\n", t.Name, t.Kind, desc)
	}
	return nil
}

func cmdPolicy(c *client, args []string, stdout io.Writer) error {
	if len(args) < 2 || args[0] != "check" {
		return fmt.Errorf("%w: toolpool policy check TOOL [key=value]...", errUsage)
	}
	flagArgs, pairs := splitFlags(args[2:])
	fs := flag.NewFlagSet("policy check", flag.ContinueOnError)
	ws := fs.String("workspace", "default", "workspace name")
	if err := parseFlags(fs, flagArgs); err != nil {
		return err
	}
	argsJSON, err := parseArgs(pairs)
	if err != nil {
		return err
	}
	var out struct {
		Decision call.Decision `json:"decision"`
	}
	if _, err := c.do(context.Background(), http.MethodPost, "/v1/policy/check", map[string]any{"tool": args[1], "args": argsJSON, "workspace": *ws}, &out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s (rule %s): %s\n", out.Decision.Action, out.Decision.Rule, out.Decision.Reason)
	return nil
}

func cmdApprovals(c *client, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "list" {
		var out struct {
			Approvals []struct {
				ID         string          `json:"id"`
				Tool       string          `json:"tool"`
				Workspace  string          `json:"workspace"`
				Args       json.RawMessage `json:"args"`
				ArgsDigest string          `json:"args_digest"`
				Reason     string          `json:"reason"`
				ExpiresAt  string          `json:"expires_at"`
			} `json:"approvals"`
		}
		if _, err := c.do(context.Background(), http.MethodGet, "/v1/approvals", nil, &out); err != nil {
			return err
		}
		if len(out.Approvals) == 0 {
			fmt.Fprintln(stdout, "no calls wait for approval")
		}
		for _, a := range out.Approvals {
			fmt.Fprintf(stdout, "%s  %s  workspace %s  expires %s\n  args: %s\n  why:  %s\n", a.ID, a.Tool, a.Workspace, a.ExpiresAt, a.Args, a.Reason)
		}
		return nil
	}
	if len(args) < 2 || (args[0] != "approve" && args[0] != "deny") {
		return fmt.Errorf("%w: toolpool approvals [list | approve ID [--always --prefix 'git push'] | deny ID [--reason TEXT]]", errUsage)
	}
	fs := flag.NewFlagSet("approvals", flag.ContinueOnError)
	always := fs.Bool("always", false, "also allow this tool (with --prefix for run_shell) for the tenant from now on")
	prefix := fs.String("prefix", "", "the command prefix that --always allows, e.g. 'git push'")
	digest := fs.String("digest", "", "approve only if the arguments still have this digest")
	reason := fs.String("reason", "", "with deny: why, told to the caller in the denied call's error (one line)")
	if err := parseFlags(fs, args[2:]); err != nil {
		return err
	}
	body := map[string]any{"decision": args[0], "always": *always}
	if *reason != "" {
		body["reason"] = *reason
	}
	if *prefix != "" {
		body["argv_prefix"] = strings.Fields(*prefix)
	}
	if *digest != "" {
		body["args_digest"] = *digest
	}
	var res call.Result
	if _, err := c.do(context.Background(), http.MethodPost, "/v1/approvals/"+args[1], body, &res); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", res.ID, res.Status)
	return nil
}

func cmdAudit(c *client, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	since := fs.String("since", "1h", "how far back: a duration (24h) or an RFC 3339 time")
	limit := fs.Int("limit", 100, "at most this many events")
	asJSON := fs.Bool("json", false, "print the events as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var raw json.RawMessage
	query := url.Values{"since": {*since}, "limit": {strconv.Itoa(*limit)}}
	if _, err := c.do(context.Background(), http.MethodGet, "/v1/audit?"+query.Encode(), nil, &raw); err != nil {
		return err
	}
	if *asJSON {
		fmt.Fprintln(stdout, string(raw))
		return nil
	}
	var out struct {
		Events []call.AuditEvent `json:"events"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("decode audit log: %w", err)
	}
	for _, e := range out.Events {
		fmt.Fprintf(stdout, "%s  %-9s %-16s %-10s %-6s %-18s %s %s\n", e.Time.Format("2006-01-02T15:04:05Z"), e.Event, e.Status, e.Tool, e.Action, e.Rule, e.CallID, e.Actor)
	}
	return nil
}
