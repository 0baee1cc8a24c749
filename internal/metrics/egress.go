package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// ruleInjected is the egress rule label of an allowed connection whose TLS the proxy terminated to add a
// credential; "none" is that of every other allowed connection.
const ruleInjected = "credential-injected"

var (
	knownEgressDecisions = setOf(call.EgressAllowed, call.EgressRefused, call.EgressFailed)
	knownEgressRules     = setOf(append([]string{ruleInjected}, egress.RuleNames...)...)
)

// egressMetrics count what the egress proxies did with the calls' connections, recorded from the final
// result of each call (its "egress" field), so each connection is counted once.
type egressMetrics struct {
	conns *prometheus.CounterVec
	bytes *prometheus.CounterVec
}

func newEgressMetrics(reg prometheus.Registerer) *egressMetrics {
	m := &egressMetrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "egress_connections_total",
			Help: "Connections (CONNECT tunnels and plain-http requests) of calls through the egress proxy, by decision (allowed, refused, failed) and rule (the refusing rule, the failure, credential-injected, or none)."},
			[]string{"decision", "rule"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "egress_bytes_total",
			Help: "Bytes calls sent (up) and received (down) through the egress proxy."}, []string{"direction"}),
	}
	m.conns.WithLabelValues(call.EgressAllowed, "none")
	m.conns.WithLabelValues(call.EgressRefused, egress.RuleDomainNotAllowed)
	m.bytes.WithLabelValues("up")
	m.bytes.WithLabelValues("down")
	reg.MustRegister(m.conns, m.bytes)
	return m
}

// finished records the egress of a call whose final state r has just been written.
func (m *egressMetrics) finished(r *call.Result) {
	for _, e := range r.Egress {
		rule := e.Rule
		if e.Decision == call.EgressAllowed && e.Credential != "" {
			rule = ruleInjected
		}
		m.conns.WithLabelValues(oneOf(e.Decision, "none", knownEgressDecisions), oneOf(rule, "none", knownEgressRules)).Add(float64(e.Connections))
		m.bytes.WithLabelValues("up").Add(float64(max(e.BytesUp, 0)))
		m.bytes.WithLabelValues("down").Add(float64(max(e.BytesDown, 0)))
	}
}
