package executor

import (
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// An accepted turn never starts before its NotBefore (set on follow-up
// work). Its message schedule fires at NotBefore rounded up to a whole
// second, by the server's clock; if this worker's clock is behind the
// server's, the turn still arrives early, and waits here.

// errNotDue is a runner.Waiting error: the runner NAKs the message until
// the turn is due, and the wait is not a failure. NotBefore bounds it.
type errNotDue struct {
	turn string
	wait time.Duration
}

func (e *errNotDue) Error() string {
	return fmt.Sprintf("turn %s is not due for another %v (not_before)", e.turn, e.wait)
}

// RetryAfter implements runner.Waiting.
func (e *errNotDue) RetryAfter() time.Duration { return e.wait }

// notDue returns nil when t may start at now, an *errNotDue while its
// NotBefore is still ahead, and INVALID_INPUT for a NotBefore further ahead
// than any follow-up can be scheduled (tools.MaxFollowUpDelay), which would
// otherwise be waited for without bound.
func notDue(t *schemas.AcceptedTurn, now time.Time) error {
	wait := t.NotBefore.Sub(now)
	switch {
	case wait <= 0:
		return nil
	case wait > tools.MaxFollowUpDelay:
		return schemas.Errorf(schemas.CodeInvalidInput, "turn %s: not_before %s is more than %v ahead", t.TurnID, t.NotBefore.Format(time.RFC3339Nano), tools.MaxFollowUpDelay)
	}
	return &errNotDue{turn: t.TurnID, wait: wait}
}
