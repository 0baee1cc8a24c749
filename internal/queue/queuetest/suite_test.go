package queuetest_test

import (
	"testing"

	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// TestStoreSuite holds the fake Store to queue.Records' contract; jetstream's TestRecordsSuite holds
// JetStream to the same tests.
func TestStoreSuite(t *testing.T) {
	queuetest.StoreSuite(t, func(*testing.T) queue.Records { return queuetest.NewStore() })
}
