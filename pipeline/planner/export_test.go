package planner

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// SetBeforeTurnWrite makes f run before each write of a planner turn
// record (its key and the record as it would be stored): an error f
// returns fails the write with it, and nothing is stored. Call it before
// Run (it is not synchronised with a running planner).
func SetBeforeTurnWrite(p *Planner, f func(ctx context.Context, key string, t *schemas.PlannerTurn) error) {
	p.turns.JS = turnWrites{JetStream: p.turns.JS, prefix: "$KV." + p.kv.Bucket() + ".", before: f}
}

// turnWrites is the planner turns' JetStream with a hook before each
// write of a record (store.Bucket writes through PublishMsg).
type turnWrites struct {
	jetstream.JetStream
	prefix string
	before func(context.Context, string, *schemas.PlannerTurn) error
}

func (w turnWrites) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if i := strings.Index(m.Subject, w.prefix); i >= 0 {
		if t, err := schemas.Decode[schemas.PlannerTurn](m.Data); err == nil {
			if err := w.before(ctx, m.Subject[i+len(w.prefix):], t); err != nil {
				return nil, err
			}
		}
	}
	return w.JetStream.PublishMsg(ctx, m, opts...)
}
