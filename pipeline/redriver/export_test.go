package redriver

import (
	"context"

	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/store"
)

// SetBeforeStart makes r call f between a batch's evaluation and its move
// to started (tests only).
func SetBeforeStart(r *Redriver, f func(turnID string)) { r.beforeStart.Store(&f) }

// SetSweepMaxLooks caps the batches one sweep pass looks at (tests only).
func SetSweepMaxLooks(r *Redriver, n int) { r.sweep.maxLooks.Store(int64(n)) }

// SweepMostLooks is the most batches one sweep pass has looked at.
func SweepMostLooks(r *Redriver) int64 { return r.sweep.mostLooks.Load() }

// AwaitingEvent is the awaiting event of turn that the sweep keeps.
func AwaitingEvent(r *Redriver, turn string) (turnlog.Event, bool) {
	return r.sweep.awaitingEvent(turn)
}

// KeepAwaiting makes the sweep keep ev as its turn's last event, as a
// watch that lags behind the log would.
func KeepAwaiting(r *Redriver, ev turnlog.Event) { r.sweep.keepAwaiting(&ev) }

// RedriveWatched is a redrive of turnID triggered by decision d, which may
// take the batch from the sweep's kept awaiting event.
func RedriveWatched(ctx context.Context, r *Redriver, turnID string, d *store.Decision) error {
	return r.redrive(ctx, turnID, "test", d, true)
}

// SetWatchWakes turns the sweep watch's wakes of queued turns on or off
// (tests only: off, only the pass announces them).
func SetWatchWakes(r *Redriver, on bool) { r.sweep.noWakes.Store(!on) }

// SweepForget makes the sweep forget turn, as a redriver whose watch has
// not delivered it yet.
func SweepForget(r *Redriver, turn string) { r.sweep.forget(turn) }
