package topology

import "time"

// SetRetryWait sets Retry's first wait until the returned function restores it.
func SetRetryWait(d time.Duration) (restore func()) {
	old := retryWait
	retryWait = d
	return func() { retryWait = old }
}
