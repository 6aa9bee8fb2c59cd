package submit

import (
	"testing"
	"time"
)

// SetStoreAttemptTimeout sets how long one attempt to store a decision
// waits, for t's duration.
func SetStoreAttemptTimeout(t testing.TB, d time.Duration) {
	old := storeAttemptTimeout
	storeAttemptTimeout = d
	t.Cleanup(func() { storeAttemptTimeout = old })
}
