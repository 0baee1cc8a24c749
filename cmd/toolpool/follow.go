package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// event is one Server-Sent Event.
type event struct {
	id, name string
	data     []byte
}

// readEvents calls fn for each event of an SSE body until it ends or fn returns false.
func readEvents(body io.Reader, fn func(event) bool) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // a result event holds the whole envelope
	var ev event
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name != "" || ev.data != nil {
				if !fn(ev) {
					return nil
				}
			}
			ev = event{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = append(ev.data, line[6:]...)
		}
	}
	return sc.Err()
}

// follower prints a call's events as they come: output bytes unchanged to stdout and stderr, each byte
// once, however often the stream is resumed.
type follower struct {
	stdout, stderr io.Writer
	id             string // the call's id, from its first status event
	last           string // the last event id, to resume from
	printed        [2]int64
	result         *call.Result
	raw            json.RawMessage
	streamed       bool
	pulled         string // the last pull report shown: image, phase and tenth of the bytes
}

// resumeFrom sets where a follower starts: after event id last ("<stdout bytes>.<stderr bytes>", then
// ".<attempt>" once a worker started the call), whose bytes were printed already. An id of another form
// is passed on as it is, for the server to refuse.
func (f *follower) resumeFrom(last string) {
	f.last = last
	parts := strings.Split(last, ".")
	if len(parts) < 2 {
		return
	}
	out, err1 := strconv.ParseInt(parts[0], 10, 64)
	errs, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 == nil && err2 == nil {
		f.printed = [2]int64{out, errs}
	}
}

// showPull prints a report of the call's image pull on stderr, when its phase changed or its bytes
// passed another tenth of the image's.
func (f *follower) showPull(p call.PullProgress) {
	tenth := int64(-1)
	if p.BytesTotal > 0 {
		tenth = p.BytesDone * 10 / p.BytesTotal
	}
	key := p.Image + " " + p.Phase + " " + strconv.FormatInt(tenth, 10)
	if key == f.pulled {
		return
	}
	f.pulled = key
	fmt.Fprintf(f.stderr, "[toolpool: %s]\n", p)
}

func (f *follower) handle(ev event) bool {
	if ev.id != "" {
		f.last = ev.id
	}
	switch ev.name {
	case "status":
		var st struct {
			ID   string             `json:"id"`
			Pull *call.PullProgress `json:"pull"`
		}
		if json.Unmarshal(ev.data, &st) == nil && st.ID != "" {
			f.id = st.ID
		}
		if st.Pull != nil {
			f.showPull(*st.Pull)
		}
	case "stdout", "stderr":
		var o struct {
			Offset int64  `json:"offset"`
			Text   string `json:"text"`
			Base64 string `json:"base64"`
		}
		if json.Unmarshal(ev.data, &o) != nil {
			return true
		}
		b := []byte(o.Text)
		if o.Base64 != "" {
			b, _ = base64.StdEncoding.DecodeString(o.Base64)
		}
		w, at := f.stdout, &f.printed[0]
		if ev.name == "stderr" {
			w, at = f.stderr, &f.printed[1]
		}
		if end := o.Offset + int64(len(b)); end > *at { // bytes before at were printed already
			_, _ = w.Write(b[max(*at-o.Offset, 0):])
			*at = end
		}
		f.streamed = true
	case "lag", "restart":
		var l struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(ev.data, &l)
		fmt.Fprintf(f.stderr, "\n[toolpool: %s]\n", l.Message)
		if ev.name == "restart" { // the call runs again: its output comes again from byte 0
			f.printed = [2]int64{}
		}
	case "result":
		var res call.Result
		if json.Unmarshal(ev.data, &res) == nil {
			f.result, f.raw = &res, json.RawMessage(ev.data)
		}
		return false
	case "error":
		var e call.ErrorInfo
		_ = json.Unmarshal(ev.data, &e)
		fmt.Fprintf(f.stderr, "\n[toolpool: %s]\n", e.Message)
	}
	return true
}

// stream sends req and follows the events it answers with; it returns an API error for a non-2xx answer.
func (c *client) stream(req *http.Request, f *follower) error {
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return apiErrorOf(resp.StatusCode, data)
	}
	return readEvents(resp.Body, f.handle)
}

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// resumeTries bounds the reconnections in a row that bring no event.
const resumeTries = 20

// follow follows call id from event id last (resuming where a broken stream left off) until its result.
// A stream that breaks is resumed as often as it breaks while each brings events; after resumeTries
// reconnections in a row without one, it gives up with an error that says how to resume.
func (c *client) follow(ctx context.Context, f *follower) error {
	for attempt := 0; f.result == nil; attempt++ {
		before := f.last
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/calls/"+f.id+"/events", nil)
		if err != nil {
			return fmt.Errorf("build request: %w", err)
		}
		if f.last != "" {
			req.Header.Set("Last-Event-ID", f.last)
		}
		err = c.stream(req, f)
		var he *httpError
		switch {
		case f.result != nil:
			return nil
		case errors.As(err, &he) && he.code < 500:
			return err
		case f.last != before:
			attempt = 0 // it got somewhere: a cut, not a failure
		case attempt >= resumeTries:
			if err == nil {
				err = errors.New("the event stream ended without the call's result")
			}
			return fmt.Errorf("follow call %s: %d reconnections brought nothing (%w); resume with toolpool follow %s --from %s", f.id, attempt, err, f.id, f.last)
		}
		time.Sleep(min(time.Duration(attempt+1)*250*time.Millisecond, 3*time.Second)) // the stream broke: resume
	}
	return nil
}

// callFollow runs a call and prints its output as it is printed, resuming if the stream breaks.
func callFollow(c *client, body map[string]any, asJSON bool, stdout, stderr io.Writer) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 1, fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, c.base+"/v1/calls", bytes.NewReader(b))
	if err != nil {
		return 1, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	f := &follower{stdout: stdout, stderr: stderr}
	if asJSON {
		f.stdout, f.stderr = io.Discard, io.Discard
	}
	err = c.stream(req, f)
	if f.result == nil && f.id != "" {
		err = c.follow(context.Background(), f)
	}
	if err != nil {
		return 1, err
	}
	if f.result == nil {
		return 1, errors.New("the event stream ended without the call's result")
	}
	return f.print(asJSON, stdout, stderr), nil
}

// print prints the result after its streamed output: the summary only, unless nothing was streamed.
func (f *follower) print(asJSON bool, stdout, stderr io.Writer) int {
	res := *f.result
	if f.streamed && !asJSON {
		res.Output = ""
	}
	return printResult(&res, f.raw, asJSON, stdout, stderr)
}

func cmdFollow(c *client, args []string, stdout, stderr io.Writer) (int, error) {
	flagArgs, rest := splitFlags(args)
	fs := flag.NewFlagSet("follow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "resume after this event id (\"<stdout bytes>.<stderr bytes>\")")
	if err := parseFlags(fs, flagArgs); err != nil {
		return 2, err
	}
	if len(rest) != 1 {
		return 2, fmt.Errorf("%w: toolpool follow ID [--from EVENT_ID]", errUsage)
	}
	f := &follower{stdout: stdout, stderr: stderr, id: rest[0]}
	f.resumeFrom(*from)
	if err := c.follow(context.Background(), f); err != nil {
		return 1, err
	}
	return f.print(false, stdout, stderr), nil
}

// cmdOutput prints bytes of a finished call's full stdout or stderr, unchanged.
func cmdOutput(c *client, args []string, stdout, stderr io.Writer) (int, error) {
	flagArgs, rest := splitFlags(args)
	fs := flag.NewFlagSet("output", flag.ContinueOnError)
	fs.SetOutput(stderr)
	errStream := fs.Bool("stderr", false, "read stderr instead of stdout")
	offset := fs.Int64("offset", 0, "the first byte to read")
	limit := fs.Int64("limit", 0, "the most bytes to read (default: everything kept, page by page)")
	if err := parseFlags(fs, flagArgs); err != nil {
		return 2, err
	}
	if len(rest) != 1 {
		return 2, fmt.Errorf("%w: toolpool output ID [--stderr] [--offset N] [--limit N]", errUsage)
	}
	name := "stdout"
	if *errStream {
		name = "stderr"
	}
	for off, left := *offset, *limit; ; {
		page := int64(1 << 20)
		if *limit > 0 {
			page = min(page, left)
		}
		url := fmt.Sprintf("%s/v1/calls/%s/%s?offset=%d&limit=%d", c.base, rest[0], name, off, page)
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		if err != nil {
			return 1, fmt.Errorf("build request: %w", err)
		}
		resp, err := c.send(req)
		if err != nil {
			return 1, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 1, fmt.Errorf("read response: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return 1, apiErrorOf(resp.StatusCode, data)
		}
		_, _ = stdout.Write(data)
		off += int64(len(data))
		left -= int64(len(data))
		kept, _ := strconv.ParseInt(resp.Header.Get("X-Toolpool-Stream-Kept"), 10, 64)
		if len(data) == 0 || off >= kept || (*limit > 0 && left <= 0) {
			if total, _ := strconv.ParseInt(resp.Header.Get("X-Toolpool-Stream-Bytes"), 10, 64); off >= kept && kept < total {
				fmt.Fprintf(stderr, "[toolpool kept the first %d of the %d bytes printed on %s]\n", kept, total, name)
			}
			return 0, nil
		}
	}
}
