package turnlog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
			ctx := context.Background()
			topo := topology.DefaultConfig()
			topo.TurnLogPartitions = 1
			l, js := newLog(b, topo)
			// Earlier turns: two events each, published without waiting.
			data := make([]byte, 600)
			var acks []jetstream.PubAckFuture
			for i := range turns {
				for _, ev := range []string{"running", "completed"} {
					f, err := js.PublishAsync(topology.TurnLogSubject(0, fmt.Sprintf("t-old-%08d", i), ev), data)
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

// BenchmarkTurnSubjects compares, at sync_interval always with 32 turns
// in flight, the two ways a turn's log can be laid out (docs/bench.md,
// "Recovery, an open question"): one subject per event, each append a
// compare-and-set on the turn's wildcard (what Log does), against one
// subject per turn, the event named in a header, each append a
// compare-and-set on that subject, and the last one rolling the subject
// up (Nats-Rollup: sub) so that an ended turn keeps one message. A turn
// is four appends (running, awaiting, started, completed). It reports
// turns/s; the difference is what the rollup (a purge inside the append)
// and the plain-subject check cost or save.
//
//	go test -run '^$' -bench TurnSubjects -benchtime 3000x -count 3 ./jetstream/turnlog
//
// Measured on the 2-core machine, six runs of each in three invocations:
// a subject per event 424, 636, 626, 634, 579, 496 turns/s (median 603);
// a subject per turn, rolled up, 427, 564, 573, 387, 470, 460 (median
// 465). The rollup keeps one message per ended turn and costs about a
// fifth of the rate.
func BenchmarkTurnSubjects(b *testing.B) {
	events := []string{"running", "awaiting", "started", "completed"}
	for _, layout := range []string{"a subject per event", "a subject per turn, rolled up"} {
		b.Run(layout, func(b *testing.B) {
			env := jstest.StartWith(b, jstest.Options{SyncAlways: true})
			ctx := context.Background()
			topo := topology.DefaultConfig()
			topo.TurnLogPartitions = 1
			if err := Provision(ctx, env.JS, topo); err != nil {
				b.Fatal(err)
			}
			sc := topo.TurnLogStreams()[0]
			sc.AllowRollup = true
			if _, err := env.JS.UpdateStream(ctx, sc); err != nil {
				b.Fatal(err)
			}
			l, err := New(ctx, env.JS, topo)
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 600)
			perTurn := layout == "a subject per turn, rolled up"
			turn := func(id string) error {
				var last uint64
				for i, ev := range events {
					if !perTurn {
						seq, err := l.Append(ctx, Append{Turn: id, Event: ev, After: last, Data: data})
						if err != nil {
							return err
						}
						last = seq
						continue
					}
					m := nats.NewMsg(topology.SubjectTurnLogPrefix + "0." + id)
					m.Data = data
					m.Header.Set("Tollgate-Event", ev)
					m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fmt.Sprint(last))
					m.Header.Set(jetstream.MsgIDHeader, id+"."+ev)
					if i == len(events)-1 {
						m.Header.Set("Nats-Rollup", "sub")
					}
					ack, err := env.JS.PublishMsg(ctx, m)
					if err != nil {
						return err
					}
					last = ack.Sequence
				}
				return nil
			}
			const inFlight = 32
			ids := make(chan string)
			errs := make(chan error, inFlight)
			b.ResetTimer()
			for range inFlight {
				go func() {
					for id := range ids {
						if err := turn(id); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for i := range b.N {
				ids <- fmt.Sprintf("t-%08d", i)
			}
			close(ids)
			for range inFlight {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
			s, _ := env.JS.Stream(ctx, sc.Name)
			if info, err := s.Info(ctx); err == nil {
				b.ReportMetric(float64(info.State.Msgs)/float64(b.N), "msgs-kept/turn")
			}
		})
	}
}
