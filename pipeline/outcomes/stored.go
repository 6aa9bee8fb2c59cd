package outcomes

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Stored reads every turn's stored outcomes, for tools that check a run
// after it (the chaos checker, the bench, the tests): those the turn logs'
// outcome events keep (the write that ended each batch), and the copies
// published on tollgate.event.turn.outcome (for a batch kept in
// tollgate_batches, or one an earlier version ended without keeping it).
// This version publishes no copy of an outcome its turn's log keeps, so a
// turn that ended once has exactly one, whichever place keeps it, and
// anything else shows: a published copy beside a logged outcome counts as
// a second one. (A turn ended by the version before this one, which
// published a copy of every outcome, shows two: read such data with the
// tools of that version.) It reads up to each stream's last message when
// it looked, with ordered consumers; a record that does not decode is an
// error.
func Stored(ctx context.Context, js jetstream.JetStream) (map[string][]*schemas.TurnOutcome, error) {
	logs, err := topology.OpenTurnLogs(ctx, js)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound): // a server provisioned before the turn logs
	case err != nil:
		return nil, err
	}
	out := map[string][]*schemas.TurnOutcome{}
	for i := range logs {
		err := bus.Scan(ctx, js, topology.TurnLogStream(i), topology.TurnLogOutcomeFilter(i), func(m jetstream.Msg) error {
			turn := Turn(m.Subject())
			o, err := store.DecodeOutcome(turn, m.Data())
			switch {
			case errors.Is(err, store.ErrNoOutcome):
				return nil // its published copy is the outcome
			case err != nil:
				return fmt.Errorf("outcome event on %s: %w", m.Subject(), err)
			}
			out[turn] = append(out[turn], o)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	err = bus.Scan(ctx, js, topology.StreamEvents, topology.SubjectTurnOutcome+"*", func(m jetstream.Msg) error {
		o, err := schemas.Decode[schemas.TurnOutcome](m.Data())
		if err != nil {
			return fmt.Errorf("outcome on %s: %w", m.Subject(), err)
		}
		out[o.TurnID] = append(out[o.TurnID], o)
		return nil
	})
	return out, err
}
