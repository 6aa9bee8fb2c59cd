package outcomes

import (
	"bytes"
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
// after it (the chaos checker, the bench): those the turn logs' outcome
// events keep (the write that ended each batch), and the copies published
// on tollgate.event.turn.outcome. A turn whose log keeps its outcome gets
// a published copy only where it is not byte for byte the logged one (a
// conflict) or repeats it (a second copy): so each turn that ended once
// has exactly one outcome, whichever place keeps it, and anything else
// shows (a server with no turn logs: the published copies alone). It
// reads up to each stream's last message when it looked, with
// ordered consumers; a record that does not decode is an error.
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
	seen := map[string]int{} // turn -> published copies read
	err = bus.Scan(ctx, js, topology.StreamEvents, topology.SubjectTurnOutcome+"*", func(m jetstream.Msg) error {
		o, err := schemas.Decode[schemas.TurnOutcome](m.Data())
		if err != nil {
			return fmt.Errorf("outcome on %s: %w", m.Subject(), err)
		}
		seen[o.TurnID]++
		if logged := out[o.TurnID]; len(logged) == 0 || seen[o.TurnID] > 1 || !same(logged[0], o) {
			out[o.TurnID] = append(out[o.TurnID], o)
		}
		return nil
	})
	return out, err
}

// same reports whether a and b encode to the same bytes.
func same(a, b *schemas.TurnOutcome) bool {
	x, xerr := schemas.Encode(a)
	y, yerr := schemas.Encode(b)
	return xerr == nil && yerr == nil && bytes.Equal(x, y)
}
