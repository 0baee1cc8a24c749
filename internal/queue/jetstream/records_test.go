package jetstream_test

import (
	"testing"

	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// TestRecordsSuite holds the JetStream records to queue.Records' contract: the tests the fake Store
// (queuetest) passes too. The subtests share one server and connection; each uses ids of its own.
func TestRecordsSuite(t *testing.T) {
	records := connect(t).Records()
	queuetest.StoreSuite(t, func(*testing.T) queue.Records { return records })
}
