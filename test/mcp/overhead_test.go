package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCallOverhead measures the same call through REST and through MCP (the Go SDK's client, at
// 2026-07-28 and at 2025-11-25), interleaved, N times each: `true` run in a container, and `sudo true`,
// which policy denies before the queue (the front end's own cost). It logs p50 and p95 per path, and runs
// only when TOOLPOOL_MCP_OVERHEAD=N:
//
//	TOOLPOOL_MCP_OVERHEAD=50 go test -run CallOverhead -v ./test/mcp/
func TestCallOverhead(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOOLPOOL_MCP_OVERHEAD"))
	if n <= 0 {
		t.Skip("set TOOLPOOL_MCP_OVERHEAD=N to measure N calls per path")
	}
	s := startStack(t)
	ctx := context.Background()
	modern := connectGo(t, s, false)
	legacy := connectGo(t, s, true)
	var report strings.Builder
	fmt.Fprintf(&report, "%-8s %-16s %9s %9s\n", "call", "path", "p50 ms", "p95 ms")
	for _, command := range []string{"true", "sudo true"} {
		paths := []struct {
			name string
			call func() error
		}{
			{"rest", func() error { return restCall(ctx, s, command) }},
			{"mcp 2026-07-28", func() error { return mcpCall(ctx, modern, command) }},
			{"mcp 2025-11-25", func() error { return mcpCall(ctx, legacy, command) }},
		}
		for _, p := range paths { // warm up each path once
			if err := p.call(); err != nil {
				t.Fatalf("%s %q: %v", p.name, command, err)
			}
		}
		took := make([][]time.Duration, len(paths))
		for range n {
			for j, p := range paths {
				start := time.Now()
				if err := p.call(); err != nil {
					t.Fatalf("%s %q: %v", p.name, command, err)
				}
				took[j] = append(took[j], time.Since(start))
			}
		}
		for j, p := range paths {
			slices.Sort(took[j])
			p50, p95 := took[j][len(took[j])/2], took[j][(len(took[j])*95+99)/100-1]
			fmt.Fprintf(&report, "%-8s %-16s %9.1f %9.1f\n", map[string]string{"true": "run", "sudo true": "denied"}[command], p.name,
				float64(p50.Microseconds())/1000, float64(p95.Microseconds())/1000)
		}
	}
	t.Logf("%d calls per path, interleaved:\n%s", n, report.String())
}

// restCall is POST /v1/calls for command, waiting for its result.
func restCall(ctx context.Context, s *stack, command string) error {
	body, _ := json.Marshal(map[string]any{"tool": "run_shell", "args": map[string]any{"command": command}, "workspace": "bench"})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/calls", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+approverToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var r struct{ Status string }
	if err := json.Unmarshal(data, &r); err != nil || (r.Status != "ok" && r.Status != "denied") {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	return nil
}

// mcpCall is a tools/call of run_shell for command.
func mcpCall(ctx context.Context, cs *sdk.ClientSession, command string) error {
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_shell", Arguments: map[string]any{"command": command},
		Meta: sdk.Meta{"toolpool/workspace": "bench"}})
	if err != nil {
		return err
	}
	if res.IsError && command == "true" {
		return fmt.Errorf("tool error: %v", res.Content)
	}
	return nil
}

// connectGo connects the Go SDK's client with the approver's token; legacy refuses server/discover, so
// the client falls back to the 2025-11-25 handshake.
func connectGo(t testing.TB, s *stack, legacy bool) *sdk.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: tokenTransport{legacy: legacy}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(),
		&sdk.StreamableClientTransport{Endpoint: s.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	want := map[bool]string{false: "2026-07-28", true: "2025-11-25"}[legacy]
	if got := cs.InitializeResult().ProtocolVersion; got != want {
		t.Fatalf("negotiated %s, want %s", got, want)
	}
	return cs
}

type tokenTransport struct{ legacy bool }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.legacy && r.Body != nil {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"server/discover"`)) {
			return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(bytes.NewReader(nil)), Header: http.Header{}, Request: r}, nil
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+approverToken)
	return http.DefaultTransport.RoundTrip(r)
}
