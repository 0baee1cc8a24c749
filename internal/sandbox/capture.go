package sandbox

import (
	"fmt"
	"io"
	"sync"
)

// Captured is one output stream after capping: the head and the tail of what the process printed, and the
// full count.
type Captured struct {
	Head  []byte
	Tail  []byte
	Total int64 // bytes the process printed in all
}

// Truncated reports whether bytes were dropped between Head and Tail.
func (c Captured) Truncated() bool { return c.Total > int64(len(c.Head)+len(c.Tail)) }

// Omitted is how many bytes were dropped.
func (c Captured) Omitted() int64 { return c.Total - int64(len(c.Head)+len(c.Tail)) }

// String joins head and tail with a marker that says how much was cut.
func (c Captured) String() string {
	if !c.Truncated() {
		return string(c.Head) + string(c.Tail)
	}
	return fmt.Sprintf("%s\n[... %d bytes omitted ...]\n%s", c.Head, c.Omitted(), c.Tail)
}

// CapWriter keeps the first half and the last half of its limit of what is written to it and counts the
// rest, so that a process printing gigabytes costs a fixed amount of memory and never blocks. Safe for
// concurrent use.
type CapWriter struct {
	mu    sync.Mutex
	limit int
	head  []byte
	ring  []byte // tail ring buffer, capacity limit - limit/2
	next  int    // write position in ring once full
	full  bool
	total int64
}

// NewCapWriter returns a CapWriter that keeps at most limit bytes.
func NewCapWriter(limit int64) *CapWriter {
	if limit < 2 {
		limit = 2
	}
	return &CapWriter{limit: int(limit)}
}

// Write records p and never fails.
func (w *CapWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	w.total += int64(n)
	headCap := w.limit / 2
	if w.head == nil {
		w.head = make([]byte, 0, headCap)
		w.ring = make([]byte, 0, w.limit-headCap)
	}
	if room := headCap - len(w.head); room > 0 {
		k := min(room, len(p))
		w.head = append(w.head, p[:k]...)
		p = p[k:]
	}
	tailCap := w.limit - headCap
	for len(p) > 0 {
		if !w.full {
			k := min(tailCap-len(w.ring), len(p))
			w.ring = append(w.ring, p[:k]...)
			p = p[k:]
			if len(w.ring) == tailCap {
				w.full = true
				w.next = 0
			}
			continue
		}
		if len(p) >= tailCap { // only the last tailCap bytes of p can survive
			p = p[len(p)-tailCap:]
		}
		k := copy(w.ring[w.next:], p)
		p = p[k:]
		w.next = (w.next + k) % tailCap
	}
	return n, nil
}

// Captured returns a copy of what was kept.
func (w *CapWriter) Captured() Captured {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := Captured{Head: append([]byte(nil), w.head...), Total: w.total}
	if w.full {
		c.Tail = append(append([]byte(nil), w.ring[w.next:]...), w.ring[:w.next]...)
	} else {
		c.Tail = append([]byte(nil), w.ring...)
	}
	return c
}

// Tee returns a writer that writes to w and then to live, and reports only w's result: live's errors and
// short writes are ignored. A nil live returns w.
func Tee(w, live io.Writer) io.Writer {
	if live == nil {
		return w
	}
	return tee{w, live}
}

type tee struct{ w, live io.Writer }

func (t tee) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	_, _ = t.live.Write(p[:n])
	return n, err
}
