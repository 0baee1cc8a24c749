package egress

import (
	"slices"
	"sync"

	"github.com/toolpool/toolpool/internal/call"
)

// maxLogEntries bounds the distinct entries of a Log; connections past it are counted in one overflow
// entry per decision, rule and credential, with host "*".
const maxLogEntries = 64

// Log is what a proxy did with its connections, one entry per host, port, decision, rule and credential,
// in the order each was first seen. Safe for concurrent use.
type Log struct {
	mu      sync.Mutex
	entries []call.EgressConn
	index   map[logKey]int
}

type logKey struct {
	host           string
	port           int
	decision, rule string
	credential     string
	overflowed     bool
}

// record counts one connection: its destination, outcome and bytes (e.Connections is ignored).
func (l *Log) record(e call.EgressConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.index == nil {
		l.index = map[logKey]int{}
	}
	k := logKey{host: e.Host, port: e.Port, decision: e.Decision, rule: e.Rule, credential: e.Credential}
	i, ok := l.index[k]
	if !ok && len(l.entries) >= maxLogEntries {
		k = logKey{host: "*", decision: e.Decision, rule: e.Rule, credential: e.Credential, overflowed: true}
		e.Host, e.Port, e.Reason = "*", 0, "more destinations than the log keeps"
		i, ok = l.index[k]
	}
	if !ok {
		first := e
		first.Connections, first.BytesUp, first.BytesDown = 0, 0, 0
		l.entries = append(l.entries, first)
		i = len(l.entries) - 1
		l.index[k] = i
	}
	l.entries[i].Connections++
	l.entries[i].BytesUp += e.BytesUp
	l.entries[i].BytesDown += e.BytesDown
}

// Entries returns a copy of the entries.
func (l *Log) Entries() []call.EgressConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}
