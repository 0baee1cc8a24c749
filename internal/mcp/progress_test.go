package mcp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestProgressReplaysEarlyOutput: with the live stream as Output, what a command printed before the
// request started following it (the handler follows once it sees the call running) still arrives as
// progress messages, in order, from the first byte.
func TestProgressReplaysEarlyOutput(t *testing.T) {
	conn, url := jstest.Provisioned(t, nil)
	worker := jstest.Connect(t, url, "worker", false)
	f := newFake(t)
	f.onSubmit = func(id string) {
		var off int64
		for _, line := range []string{"printed first\n", "printed second\n"} {
			if err := worker.Live().PublishChunk(context.Background(), id, queue.Chunk{Stream: call.StreamStdout, Offset: off, Data: []byte(line)}); err != nil {
				t.Errorf("publish: %v", err)
			}
			off += int64(len(line))
		}
	}
	h, err := New(testConfig(), f, f, slog.New(slog.NewTextHandler(io.Discard, nil)), WithOutput(conn.Live()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
	}))
	t.Cleanup(srv.Close)
	rec := &recorder{}
	cs := connect(t, srv.URL, rec.options("accept"))
	done := make(chan *sdk.CallToolResult, 1)
	go func() { done <- callTool(t, cs, "gated", sdk.Meta{"progressToken": "p1"}) }()
	progress := rec.waitProgress(t, "printed second")
	close(f.release)
	<-done
	var lines []string
	for _, m := range progress {
		if strings.HasPrefix(m, "printed") {
			lines = append(lines, m)
		}
	}
	if !slices.Equal(lines, []string{"printed first\n", "printed second\n"}) {
		t.Errorf("output in the progress messages: %q, want both lines printed before following, in order", lines)
	}
}
