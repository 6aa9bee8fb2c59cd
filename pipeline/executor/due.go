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

// errWaiting is a runner.Waiting error: the runner NAKs the message for
// wait, and the wait is not a failure. A turn that is not due yet waits
// (notDue: NotBefore bounds it), and so does a turn whose previews are not
// all in (previews.go: the preview deadline bounds it).
type errWaiting struct {
	why  string
	wait time.Duration
}

func (e *errWaiting) Error() string { return e.why }

// RetryAfter implements runner.Waiting.
func (e *errWaiting) RetryAfter() time.Duration { return e.wait }

// notDue returns nil when t may start at now, an *errWaiting while its
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
	return &errWaiting{why: fmt.Sprintf("turn %s is not due for another %v (not_before)", t.TurnID, wait), wait: wait}
}
