// Spilling: output fields too large for a record go to the output store.

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// spill moves every output field whose JSON encoding is larger than InlineBytes into the output store,
// named by the call, its claim revision and the field, and returns the names it stored. A field that
// cannot be stored is cut to fit the record, with a note.
func (w *Worker) spill(ctx context.Context, r *call.Result, claimRev uint64) []string {
	var stored []string
	for _, f := range []struct {
		name string
		text *string
	}{{"output", &r.Output}, {"stdout", &r.Stdout}, {"stderr", &r.Stderr}} {
		if encodedLen(*f.text) <= w.cfg.InlineBytes {
			continue
		}
		name := queue.OutputName(r.ID, claimRev, f.name)
		text := *f.text
		if err := w.putOutput(ctx, name, func() io.Reader { return strings.NewReader(text) }); err == nil {
			if r.Stored == nil {
				r.Stored = map[string]string{}
			}
			r.Stored[f.name] = name
			*f.text = ""
			stored = append(stored, name)
			continue
		}
		*f.text = cutUTF8(*f.text, w.cfg.InlineBytes/6) + "\n[toolpool could not store the rest of this output and cut it here]"
		r.Truncated = true
	}
	return stored
}

// outputRetryForTest bounds how long storing an output is retried while the store is unreachable; a
// variable only for tests.
var outputRetryForTest = 30 * time.Second

// putOutput stores what open yields under name, retrying (with a fresh reader from open) while the store
// is unreachable.
func (w *Worker) putOutput(ctx context.Context, name string, open func() io.Reader) error {
	if w.outputs == nil {
		return errors.New("no output store")
	}
	err := retry(ctx, time.Now().Add(outputRetryForTest), 50*time.Millisecond, 2*time.Second, func() (bool, error) {
		_, err := w.outputs.PutOutput(ctx, name, open())
		return err == nil, err
	})
	if err != nil {
		w.log.ErrorContext(ctx, "store output", "name", name, "error", err)
	}
	return err
}

// dropOutputs removes outputs this worker stored for a result it could not record.
func (w *Worker) dropOutputs(ctx context.Context, names []string) {
	for _, n := range names {
		if err := w.outputs.DeleteOutput(ctx, n); err != nil {
			w.log.WarnContext(ctx, "delete unrecorded output (it expires with the result TTL)", "name", n, "error", err)
		}
	}
}

// encodedLen is the length of s as a JSON string.
func encodedLen(s string) int {
	if len(s) < 1024 { // at most 6 bytes per byte, never over any sensible limit
		return 6 * len(s)
	}
	b, _ := json.Marshal(s)
	return len(b)
}

// cutUTF8 returns at most n bytes of s, not splitting a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
