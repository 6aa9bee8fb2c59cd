package sessionorder_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// BenchmarkNextInboundOfSession measures the session-order check's
// lookup (Checker.Check): the next inbound message of one session from a
// sequence on, on a real server's TOLLGATE_INBOUND, with `between` messages
// of other sessions (each its own, as in a busy deployment) stored between
// the session's two messages. The check asks with the literal subject of
// the turn's transport (topology.InboundSessionSubject); the wildcard
// filter of any transport, which it used before (and still uses for a
// legacy key), is there for comparison.
//
//	go test -run '^$' -bench NextInboundOfSession ./pipeline/sessionorder
//
// Measured (nats-server 2.15.2, 2 cores, -benchtime 2000x): wildcard
// 0.17 / 0.50 / 3.5 ms with 10 / 1,000 / 10,000 messages in between,
// literal 0.15 / 0.40 / 1.9 ms: both grow with the traffic (a block's
// per-subject state knows a subject's first and last sequence in the block,
// so a lookup from between them walks the messages), so the literal filter
// alone is no fix; a get by a known sequence stays at 0.15-0.18 ms.
func BenchmarkNextInboundOfSession(b *testing.B) {
	for _, between := range []int{10, 1000, 10000} {
		env := jstest.Start(b)
		ctx := context.Background()
		stream, err := env.JS.Stream(ctx, topology.StreamInbound)
		if err != nil {
			b.Fatal(err)
		}
		const session = "bench-session"
		key := schemas.SessionKey("cli", session)
		first := publish(b, env.JS, topology.InboundSubject("cli", session))
		for i := range between {
			publish(b, env.JS, topology.InboundSubject("cli", fmt.Sprintf("other-%d", i)))
		}
		second := publish(b, env.JS, topology.InboundSubject("cli", session))
		for _, f := range []struct{ name, filter string }{
			{"wildcard", topology.InboundSessionFilter(key)},
			{"literal", topology.InboundSessionSubject("cli", key)},
			// The message by its sequence: what a lookup costs when the
			// sequence is known (say, stamped on the later turn at ingest).
			{"by-sequence", ""},
		} {
			b.Run(fmt.Sprintf("between=%d/%s", between, f.name), func(b *testing.B) {
				for b.Loop() {
					from, opts := first+1, []jetstream.GetMsgOpt{jetstream.WithGetMsgSubject(f.filter)}
					if f.filter == "" {
						from, opts = second, nil
					}
					m, err := stream.GetMsg(ctx, from, opts...)
					if err != nil {
						b.Fatal(err)
					}
					if m.Sequence != second {
						b.Fatalf("found seq %d, want %d", m.Sequence, second)
					}
				}
			})
		}
	}
}

func publish(b *testing.B, js jetstream.JetStream, subject string) uint64 {
	b.Helper()
	ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: subject, Data: []byte("x")})
	if err != nil {
		b.Fatal(err)
	}
	return ack.Sequence
}
