package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The two one-write-per-fact designs make each fact durable once: 4
// writes on the fast path and 9 on the approval path, with no session
// record, no claim record and no event publish among them.
func TestDesignSequencesWriteEachFactOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		seq    []step
		writes int
	}{
		{"records are the log, fast turn: four writes", recordsFast, 4},
		{"records are the log, approval turn: nine writes", recordsApproval, 9},
		{"the turn's events are the log, fast turn: four writes", eventsFast, 4},
		{"the turn's events are the log, approval turn: nine writes", eventsApproval, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := countWrites(tc.seq).Total; n != tc.writes {
				t.Errorf("%d writes, want %d", n, tc.writes)
			}
			facts := map[string]bool{}
			for _, s := range tc.seq {
				switch {
				case strings.HasPrefix(s.On, topology.BucketSessions+"/"), strings.HasPrefix(s.On, topology.BucketClaims+"/"):
					t.Errorf("%v: a session or claim record", s)
				case s.Op == "publish" && strings.HasPrefix(s.On, "tollgate.event."):
					t.Errorf("%v: an event published beside the record", s)
				case s.Stage != "client" && (s.Op == "kv.create" || s.Op == "kv.update" || s.Op == "log.append"):
					if s.Fact == "" {
						t.Errorf("%v: a state write names no fact", s)
					}
					key := s.Fact + " " + strings.SplitN(s.On, "/", 2)[0]
					if facts[key] {
						t.Errorf("%v: the fact %s is written twice", s, s.Fact)
					}
					facts[key] = true
				}
			}
			if !facts[factOutcome+" "+topology.BucketBatches] && !facts[factOutcome+" tollgate.turnlog.<p>.<turn>."+factOutcome] {
				t.Errorf("no outcome among the writes: %v", facts)
			}
		})
	}
}

// Each design, run by the raw stages on a real server, stores exactly its
// sequence's writes per turn (the stream sequences of every stream and
// bucket, counted), ends every turn, and keeps a session's turns in order
// through the predecessor ingest stamps on each.
func TestDesignsStoreTheirSequencesWrites(t *testing.T) {
	const turns = 4
	for _, l := range []rawLayout{{design: designRecords, partitions: 2}, {design: designEvents, partitions: 2}} {
		for _, p := range []path{fastPath, approvalPath} {
			t.Run(l.String()+", "+p.String()+" path", func(t *testing.T) {
				e, js := connectedEnv(t, single, "raw")
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if err := ensureLayout(ctx, js, single, l); err != nil {
					t.Fatal(err)
				}
				seq := l.sequence(p, nil)
				r, err := startRawStagesIn(js, seq, p, l)
				if err != nil {
					t.Fatal(err)
				}
				defer r.close()
				nc, djs, err := e.connect("driver")
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				d, err := newDriver(nc, djs, "layout", p, true, p.decided(), l.oneWritePerFact())
				if err != nil {
					t.Fatal(err)
				}
				defer d.close()
				if err := d.watchFacts(l.factSubjects()); err != nil {
					t.Fatal(err)
				}
				before, err := e.storedWrites(ctx, js)
				if err != nil {
					t.Fatal(err)
				}
				for i := range turns {
					if _, err := d.turn(ctx, "one-session"); err != nil {
						t.Fatalf("turn %d: %v (raw stages: %d errors, last %v; %d conflicts; %d waits)", i+1, err, r.errs.Load(), r.lastErr.Load(), r.conflicts.Load(), r.waits.Load())
					}
				}
				// The driver sees the last write as the server routes it,
				// which can be before its stream stored it: wait until the
				// count stops short no more, then assert it exactly.
				want := uint64(turns * countWrites(seq).Total)
				var after uint64
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if after, err = e.storedWrites(ctx, js); err != nil {
						t.Fatal(err)
					}
					if after-before >= want {
						break
					}
				}
				if got := after - before; got != want {
					l := js.ListStreams(ctx)
					for info := range l.Info() {
						t.Logf("%s: last seq %d", info.Config.Name, info.State.LastSeq)
					}
					t.Errorf("%d writes stored for %d turns, want %d", got, turns, want)
				}
				if n := r.errs.Load(); n > 0 {
					t.Errorf("%d raw stage errors, last %v", n, r.lastErr.Load())
				}
				if n := r.conflicts.Load(); n > 0 {
					t.Errorf("%d compare-and-set conflicts", n)
				}
			})
		}
	}
}

// A compare-and-set write whose first attempt was stored is refused when
// made again (nats-server checks the compare-and-set before the message
// id): the writer reads it back and recognises its own write; another
// writer's write at the same revision stays a conflict.
func TestCASWriterRecognisesItsOwnStoredWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, w := designWriter(ctx, t)
	for _, tc := range []struct {
		name        string
		first, next casWrite // next is first's successor, at first's sequence
	}{
		{"a KV record, created and then updated at its revision",
			casWrite{stream: "KV_" + topology.BucketApprovals, subject: "$KV." + topology.BucketApprovals + ".a-1", msgID: "a-1:requested", data: []byte("pending")},
			casWrite{stream: "KV_" + topology.BucketApprovals, subject: "$KV." + topology.BucketApprovals + ".a-1", msgID: "a-1:decided", data: []byte("approved")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, err := w.cas(ctx, tc.first)
			if err != nil {
				t.Fatal(err)
			}
			again, err := w.cas(ctx, tc.first) // its acknowledgement lost: made again
			if err != nil || again != seq {
				t.Fatalf("the same write made again: sequence %d, %v; want %d, recognised", again, err, seq)
			}
			other := tc.first
			other.msgID, other.data = "someone else", []byte("theirs")
			if _, err := w.cas(ctx, other); !errors.Is(err, errWrongLast) {
				t.Fatalf("another writer's write at the same revision: %v, want a conflict", err)
			}
			next := tc.next
			next.rev = seq
			nseq, err := w.cas(ctx, next)
			if err != nil || nseq <= seq {
				t.Fatalf("the successor at the write's sequence: %d, %v", nseq, err)
			}
			// Once the subject (or the turn) has moved on, the first write
			// made again is a conflict: it is no longer the last.
			if _, err := w.cas(ctx, tc.first); !errors.Is(err, errWrongLast) {
				t.Fatalf("a stale write made again: %v, want a conflict", err)
			}
		})
	}
	if n := w.own.Load(); n != 1 {
		t.Errorf("%d writes recognised as the writer's own, want 1", n)
	}
}

// A write whose acknowledgement never came (here: stored, and then its
// answer replaced by a timeout) is sent again; the server refuses the
// second attempt's compare-and-set, and the writer recognises the stored
// write as its own instead of reporting a conflict.
func TestCASWriterRetriesAWriteWithoutAcknowledgement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, w := designWriter(ctx, t)
	attempts := 0
	w.send = func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
		attempts++
		ack, err := js.PublishMsg(ctx, m)
		if attempts == 1 && err == nil {
			return nil, nats.ErrTimeout // stored, but the answer is lost
		}
		return ack, err
	}
	subj := "$KV." + topology.BucketClaims + ".c-2"
	seq, err := w.cas(ctx, casWrite{stream: "KV_" + topology.BucketClaims, subject: subj, msgID: "c-2:claimed", data: []byte("claimed")})
	if err != nil || seq == 0 {
		t.Fatalf("the write sent again: sequence %d, %v; want its sequence, recognised", seq, err)
	}
	if attempts != 2 || w.retries.Load() != 1 || w.own.Load() != 1 {
		t.Errorf("%d attempts, %d retries, %d recognised; want 2, 1, 1", attempts, w.retries.Load(), w.own.Load())
	}
	info, err := js.Stream(ctx, "KV_"+topology.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d messages in the claims bucket, want the one write", n)
	}
}

// designWriter starts a server with design (b)'s one turn-log stream and
// returns a connection to it and a raw writer on it.
func designWriter(ctx context.Context, t *testing.T) (jetstream.JetStream, *rawWriter) {
	t.Helper()
	_, js := connectedEnv(t, single, "writer")
	l := rawLayout{design: designEvents, partitions: 1}
	if err := ensureLayout(ctx, js, single, l); err != nil {
		t.Fatal(err)
	}
	return js, &rawWriter{js: js}
}
