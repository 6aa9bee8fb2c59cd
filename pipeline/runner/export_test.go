package runner

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// Test hooks for the consume-loop watchdog.

// StallState and Stalled expose the watchdog's decision for table tests.
type StallState = stallState

func Stalled(s StallState, window time.Duration) (bool, string) { return stalled(s, window) }

// SetClock makes r's watchdog read time from now. Call it before Run.
func SetClock(r *Runner, now func() time.Time) { r.now = now }

// ManualWatchdog stops r's watchdog from checking on its own: only
// CheckStall runs a check. Call it before Run.
func ManualWatchdog(r *Runner) { r.manualWatchdog = true }

var errNotConsuming = errors.New("runner is not consuming")

// Consuming reports whether Run has started consuming.
func Consuming(r *Runner) bool { return r.loop.Load() != nil }

// CheckStall runs one watchdog check, as its ticker would, and reports
// whether it restarted the consume loop.
func CheckStall(ctx context.Context, r *Runner) (bool, error) {
	l := r.loop.Load()
	if l == nil {
		return false, errNotConsuming
	}
	return l.check(ctx)
}

// StallConsume ends r's consume context behind its back and waits until it
// is closed: the runner still believes it is consuming, but nothing pulls,
// as after nats.go issue #2063 (github.com/nats-io/nats.go/issues/2063).
func StallConsume(r *Runner) error {
	l := r.loop.Load()
	if l == nil {
		return errNotConsuming
	}
	cc := l.current()
	if cc == nil {
		return errNotConsuming
	}
	cc.Stop()
	select {
	case <-cc.Closed():
		return nil
	case <-jstest.After(jstest.Wait):
		return errors.New("consume context did not close")
	}
}

// FitDeadLetter exposes fitDeadLetter for its table test.
func FitDeadLetter(own, copied nats.Header, msgID string, data []byte, maxPayload int64) (nats.Header, []byte) {
	return fitDeadLetter(own, copied, msgID, data, maxPayload)
}
