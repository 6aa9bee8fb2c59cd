package turnlog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// BenchmarkAppendAmongManyTurns: a turn's two appends (its first event,
// then one after it: each a compare-and-set on the turn's wildcard) on a
// log that already holds the events of Turns earlier turns, as the logs
// will after days of retention. It checks that the server's per-turn
// check (the last sequence of tollgate.turnlog.<p>.<turn>.>) does not
// grow with the turns the stream holds. Default flush, one partition.
//
//	go test -run '^$' -bench AppendAmongManyTurns -benchtime 2000x ./jetstream/turnlog
//
// Measured on the 2-core machine: 112 µs an append on an empty log, 98 µs
// among 100,000 earlier turns, and 107 µs among 1,000,000 (2,000,000
// subjects; the list below edited for that run, 55 s with the preload):
// the check does not grow with the log.
func BenchmarkAppendAmongManyTurns(b *testing.B) {
	for _, turns := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("%d earlier turns", turns), func(b *testing.B) {
			env := jstest.Start(b)
			ctx := context.Background()
			topo := topology.DefaultConfig()
			topo.TurnLogPartitions = 1
			if err := Provision(ctx, env.JS, topo); err != nil {
				b.Fatal(err)
			}
			l, err := New(ctx, env.JS, topo)
			if err != nil {
				b.Fatal(err)
			}
			// Earlier turns: two events each, published without waiting.
			data := make([]byte, 600)
			var acks []jetstream.PubAckFuture
			for i := range turns {
				for _, ev := range []string{"running", "completed"} {
					f, err := env.JS.PublishAsync(topology.TurnLogSubject(0, fmt.Sprintf("t-old-%08d", i), ev), data)
					if err != nil {
						b.Fatal(err)
					}
					acks = append(acks, f)
				}
				if len(acks) >= 4000 {
					for _, f := range acks {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							b.Fatal(err)
						case <-time.After(30 * time.Second):
							b.Fatal("no acknowledgement")
						}
					}
					acks = acks[:0]
				}
			}
			for _, f := range acks {
				<-f.Ok()
			}
			b.ResetTimer()
			for i := range b.N {
				turn := fmt.Sprintf("t-new-%08d", i)
				seq, err := l.Append(ctx, Append{Turn: turn, Event: "running", Data: data})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := l.Append(ctx, Append{Turn: turn, Event: "completed", After: seq, Data: data}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(2*b.N), "µs/append")
		})
	}
}
