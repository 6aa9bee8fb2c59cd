package turnlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// bareJS starts a server with JetStream and nothing on it (jstest.Start
// ensures the whole topology, with the default number of turn logs) and
// returns a connection to it.
func bareJS(t testing.TB) jetstream.JetStream {
	t.Helper()
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// newLog starts a server, provisions topo's turn logs on it (and nothing
// else) and returns a Log on them (with opts) and the connection.
func newLog(t testing.TB, topo topology.Config, opts ...Option) (*Log, jetstream.JetStream) {
	t.Helper()
	js := bareJS(t)
	ctx := jstest.Ctx(t)
	if err := Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, js, topo, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, js
}

func mustAppend(t *testing.T, l *Log, a Append) uint64 {
	t.Helper()
	seq, err := l.Append(jstest.Ctx(t), a)
	if err != nil {
		t.Fatalf("append %s.%s after %d: %v", a.Turn, a.Event, a.After, err)
	}
	return seq
}

func TestATurnsEventsFollowEachOther(t *testing.T) {
	l, _ := newLog(t, topology.DefaultConfig())
	ctx := jstest.Ctx(t)
	if _, err := l.Last(ctx, "t-1"); !errors.Is(err, ErrNoEvents) {
		t.Fatalf("Last of a turn without events: %v, want ErrNoEvents", err)
	}
	running := mustAppend(t, l, Append{Turn: "t-1", Event: "running", Data: []byte("claimed 0")})
	awaiting := mustAppend(t, l, Append{Turn: "t-1", Event: "awaiting", After: running, Data: []byte("waits on a-1")})
	last, err := l.Last(ctx, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if last.Name != "awaiting" || last.Seq != awaiting || string(last.Data) != "waits on a-1" || last.MsgID != "t-1.awaiting" || last.Turn != "t-1" {
		t.Fatalf("last event %+v, want awaiting at %d with its data and id", last, awaiting)
	}
	if _, err := l.Append(ctx, Append{Turn: "t-1", Event: "outcome", After: running}); !errors.Is(err, ErrConflict) {
		t.Fatalf("an append after an event that is no longer the last: %v, want ErrConflict", err)
	}
	if _, err := l.Append(ctx, Append{Turn: "t-1", Event: "running"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a first event of a turn that has events (another id): %v, want ErrConflict", err)
	}
	if last, _ := l.Last(ctx, "t-1"); last.Seq != awaiting {
		t.Fatalf("after two refused appends the last event is %d (%s), want %d", last.Seq, last.Name, awaiting)
	}
}

// The compare-and-set covers one turn: appends of other turns of the
// same partition, made in between, do not move it.
func TestTurnsOfOnePartitionDoNotConflict(t *testing.T) {
	topo := topology.DefaultConfig()
	topo.TurnLogPartitions = 1
	l, _ := newLog(t, topo)
	a := mustAppend(t, l, Append{Turn: "t-a", Event: "running"})
	for i := range 5 {
		mustAppend(t, l, Append{Turn: fmt.Sprintf("t-other-%d", i), Event: "running"})
	}
	b := mustAppend(t, l, Append{Turn: "t-a", Event: "outcome", After: a})
	if b <= a+5 {
		t.Fatalf("t-a's outcome at %d, want after the others' (%d..%d)", b, a+1, a+5)
	}
}

// An append whose acknowledgement was lost after it was stored is sent
// again with the same message id; the server refuses the second attempt
// (its compare-and-set no longer holds) and the writer recognises the
// stored event as its own: one event, one success.
func TestAnAppendWhoseAcknowledgementIsLostIsRecognised(t *testing.T) {
	var mu sync.Mutex
	attempts := 0
	var js jetstream.JetStream
	l, js := newLog(t, topology.DefaultConfig(), withPublish(func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
		mu.Lock()
		attempts++
		first := attempts == 1
		mu.Unlock()
		ack, err := js.PublishMsg(ctx, m)
		if first && err == nil {
			return nil, nats.ErrTimeout // stored, but the answer is lost
		}
		return ack, err
	}))
	seq, err := l.Append(jstest.Ctx(t), Append{Turn: "t-2", Event: "running", Data: []byte("x")})
	if err != nil || seq != 1 {
		t.Fatalf("the append sent again: sequence %d, %v; want 1, recognised", seq, err)
	}
	if st := l.Stats(); attempts != 2 || st.Retries != 1 || st.Own != 1 {
		t.Errorf("%d attempts, stats %+v; want 2 attempts, 1 retry, 1 recognised", attempts, st)
	}
	s, err := js.Stream(jstest.Ctx(t), topology.TurnLogStream(l.Partition("t-2")))
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d messages in the turn's log stream, want the one append", n)
	}
}

// A stage that crashed after its append was stored makes it again on
// redelivery, after the same event: recognised while it is the turn's
// last event, a conflict once the log has moved past it.
func TestAnAppendMadeAgainAfterACrash(t *testing.T) {
	l, _ := newLog(t, topology.DefaultConfig())
	first := Append{Turn: "t-3", Event: "running", Data: []byte("claimed")}
	seq := mustAppend(t, l, first)
	if again := mustAppend(t, l, first); again != seq {
		t.Fatalf("the same append made again: %d, want %d (recognised)", again, seq)
	}
	other := first
	other.MsgID = "someone-else"
	if _, err := l.Append(jstest.Ctx(t), other); !errors.Is(err, ErrConflict) {
		t.Fatalf("another writer's append after the same event: %v, want ErrConflict", err)
	}
	mustAppend(t, l, Append{Turn: "t-3", Event: "outcome", After: seq})
	if _, err := l.Append(jstest.Ctx(t), first); !errors.Is(err, ErrConflict) {
		t.Fatalf("a stale append made again: %v, want ErrConflict", err)
	}
	if st := l.Stats(); st.Own != 1 {
		t.Errorf("%d appends recognised as own, want 1", st.Own)
	}
}

// Writers racing to append after the same event: exactly one wins, every
// other gets ErrConflict, and the log holds the one winner.
func TestRacingAppendsHaveOneWinner(t *testing.T) {
	l, _ := newLog(t, topology.DefaultConfig())
	ctx := jstest.Ctx(t)
	base := mustAppend(t, l, Append{Turn: "t-4", Event: "awaiting"})
	const writers = 16
	var wg sync.WaitGroup
	wins := make(chan string, writers)
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("t-4.started.%d", i)
			_, err := l.Append(ctx, Append{Turn: "t-4", Event: "started", After: base, MsgID: id})
			switch {
			case err == nil:
				wins <- id
			case errors.Is(err, ErrConflict):
			default:
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(wins)
	close(errs)
	for err := range errs {
		t.Errorf("an append failed other than by conflict: %v", err)
	}
	var won []string
	for id := range wins {
		won = append(won, id)
	}
	if len(won) != 1 {
		t.Fatalf("%d winners %v, want exactly one", len(won), won)
	}
	if last, err := l.Last(ctx, "t-4"); err != nil || last.MsgID != won[0] || last.Seq != base+1 {
		t.Fatalf("last event %+v (%v), want the winner %s right after %d", last, err, won[0], base)
	}
}

func TestAppendRefusesWhatIsNoSubjectToken(t *testing.T) {
	l, _ := newLog(t, topology.DefaultConfig())
	for _, tc := range []struct{ name, turn, event string }{
		{"a turn id with a dot", "t-1.x", "running"},
		{"a turn id with a wildcard", "t-*", "running"},
		{"an empty turn id", "", "running"},
		{"an event with a dot", "t-1", "run.ning"},
		{"an event with upper case", "t-1", "Running"},
		{"an empty event", "t-1", ""},
		{"an event that is a wildcard", "t-1", ">"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.Append(jstest.Ctx(t), Append{Turn: tc.turn, Event: tc.event}); !errors.Is(err, ErrInvalid) {
				t.Fatalf("append %q %q: %v, want ErrInvalid", tc.turn, tc.event, err)
			}
		})
	}
	if _, err := l.Last(jstest.Ctx(t), "t-1.>"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Last of a wildcard: %v, want ErrInvalid", err)
	}
}

// An append with no server to answer fails after its attempts, within
// their bounds, with the connection's error; it is not a conflict.
func TestAnAppendWithoutAnAnswerFailsAfterItsAttempts(t *testing.T) {
	attempts := 0
	l, _ := newLog(t, topology.DefaultConfig(), WithAttempts(3, 50*time.Millisecond),
		withPublish(func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
			attempts++
			<-ctx.Done()
			return nil, ctx.Err()
		}))
	_, err := l.Append(jstest.Ctx(t), Append{Turn: "t-5", Event: "running"})
	if err == nil || errors.Is(err, ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append without answers: %v, want the attempts' deadline, not a conflict", err)
	}
	if attempts != 3 || l.Stats().Retries != 2 {
		t.Fatalf("%d attempts, %d retries; want 3 and 2", attempts, l.Stats().Retries)
	}
}

func TestTurnsSpreadOverThePartitions(t *testing.T) {
	const turns, partitions = 4000, 4
	count := make([]int, partitions)
	for i := range turns {
		turn := fmt.Sprintf("t-%020x", i*7919)
		p := topology.TurnLogPartition(turn, partitions)
		if p != topology.TurnLogPartition(turn, partitions) {
			t.Fatal("a turn's partition changed between two calls")
		}
		count[p]++
	}
	for p, n := range count {
		if n < turns/partitions*8/10 {
			t.Errorf("partition %d holds %d of %d turns, want about %d: %v", p, n, turns, turns/partitions, count)
		}
	}
}

// Provision makes the topology's turn-log streams, each with its own
// subjects, the topology's limits and duplicate window; a second
// provision changes nothing.
func TestProvisionMakesEachPartitionsStream(t *testing.T) {
	topo := topology.DefaultConfig()
	topo.TurnLogPartitions = 3
	_, js := newLog(t, topo)
	ctx := jstest.Ctx(t)
	if err := Provision(ctx, js, topo); err != nil {
		t.Fatalf("provision again: %v", err)
	}
	for i := range 3 {
		s, err := js.Stream(ctx, topology.TurnLogStream(i))
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if want := fmt.Sprintf("tollgate.turnlog.%d.>", i); len(c.Subjects) != 1 || c.Subjects[0] != want {
			t.Errorf("%s subjects %v, want [%s]", c.Name, c.Subjects, want)
		}
		if c.Duplicates != topo.DuplicateWindow || c.MaxAge != topo.MaxAge || !c.AllowDirect {
			t.Errorf("%s: duplicates %v, max age %v, direct %v; want %v, %v, true (one replica)", c.Name, c.Duplicates, c.MaxAge, c.AllowDirect, topo.DuplicateWindow, topo.MaxAge)
		}
	}
	if _, err := js.Stream(ctx, topology.TurnLogStream(3)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a fourth stream: %v, want none", err)
	}
	bad := topo
	bad.TurnLogPartitions = topology.MaxTurnLogPartitions + 1
	if err := Provision(ctx, js, bad); err == nil {
		t.Error("provision with too many partitions: want an error")
	}
}
