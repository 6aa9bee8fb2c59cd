package turnlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// onePartition is a topology with a single turn log, so that a test
// knows every event's stream sequence.
func onePartition() topology.Config {
	topo := topology.DefaultConfig()
	topo.TurnLogPartitions = 1
	return topo
}

// watch starts a Watch of l, stopped at the end of the test.
func watch(t *testing.T, l *Log) *Watcher {
	t.Helper()
	w, err := l.Watch(jstest.Ctx(t))
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Cleanup(w.Stop)
	return w
}

// next is w's next update (nil: the marker), failing the test if none
// comes in time or the watch ends.
func next(t *testing.T, w *Watcher) *Event {
	t.Helper()
	select {
	case ev, ok := <-w.Updates():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-jstest.After(jstest.Wait):
		t.Fatal("no update from the watch")
	}
	return nil
}

// untilMarker is every update of w before the marker.
func untilMarker(t *testing.T, w *Watcher) []*Event {
	t.Helper()
	var out []*Event
	for {
		ev := next(t, w)
		if ev == nil {
			return out
		}
		out = append(out, ev)
	}
}

// seqs are the stream sequences of evs, in order.
func seqs(evs []*Event) []uint64 {
	var out []uint64
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

// turnInPartition is a turn id of partition p among partitions, the
// first after those in skip.
func turnInPartition(t *testing.T, p, partitions int, skip ...string) string {
	t.Helper()
	for i := range 10_000 {
		turn := fmt.Sprintf("t-%d-%d", p, i)
		if topology.TurnLogPartition(turn, partitions) == p && !slices.Contains(skip, turn) {
			return turn
		}
	}
	t.Fatalf("no turn id in partition %d of %d", p, partitions)
	return ""
}

// Watch delivers, as a KV watch does, the last event of each name of
// every turn the log holds when it starts, in stream order (so a turn's
// last event is the last of its events delivered), then the marker (nil),
// then every event appended since: of a turn the log held, and of a new
// turn.
func TestWatchDeliversTheLastEventsThenTheMarkerThenAppends(t *testing.T) {
	l, _ := newLog(t, onePartition())
	ctx := jstest.Ctx(t)
	a1 := mustAppend(t, l, Append{Turn: "t-a", Event: "running", Data: []byte("a, first run")})
	a2 := mustAppend(t, l, Append{Turn: "t-a", Event: "awaiting", After: a1, Data: []byte("a waits")})
	a3 := mustAppend(t, l, Append{Turn: "t-a", Event: "running", After: a2, MsgID: "t-a.running.again", Data: []byte("a, second run")})
	b1 := mustAppend(t, l, Append{Turn: "t-b", Event: "running", Data: []byte("b runs")})
	c1 := mustAppend(t, l, Append{Turn: "t-c", Event: "running"})
	c2 := mustAppend(t, l, Append{Turn: "t-c", Event: "completed", After: c1, Data: []byte("c done")})

	w := watch(t, l)
	initial := untilMarker(t, w)
	// t-a's first "running" was replaced by its second: not delivered.
	if want := []uint64{a2, a3, b1, c1, c2}; !slices.Equal(seqs(initial), want) {
		t.Fatalf("events before the marker at %v, want %v (the last of each turn's event names, in stream order)", seqs(initial), want)
	}
	last := map[string]*Event{}
	for _, ev := range initial {
		last[ev.Turn] = ev
	}
	for _, turn := range []string{"t-a", "t-b", "t-c"} {
		want, err := l.Last(ctx, turn)
		if err != nil {
			t.Fatal(err)
		}
		if got := last[turn]; got == nil || got.Seq != want.Seq || got.Name != want.Name {
			t.Errorf("the last event of %s delivered is %+v, want its last, %s at %d", turn, got, want.Name, want.Seq)
		}
	}
	ev := initial[1]
	if ev.Turn != "t-a" || ev.Name != "running" || ev.Seq != a3 || ev.MsgID != "t-a.running.again" || string(ev.Data) != "a, second run" ||
		ev.Header.Get(jetstream.MsgIDHeader) != "t-a.running.again" || ev.Time.IsZero() {
		t.Errorf("event %+v, want t-a's second running as stored, with its id, headers and time", ev)
	}

	a4 := mustAppend(t, l, Append{Turn: "t-a", Event: "completed", After: a3, Data: []byte("a done")})
	d1 := mustAppend(t, l, Append{Turn: "t-d", Event: "running", Data: []byte("d, new")})
	if ev := next(t, w); ev == nil || ev.Turn != "t-a" || ev.Name != "completed" || ev.Seq != a4 || string(ev.Data) != "a done" {
		t.Fatalf("after the marker: %+v, want t-a's completed at %d", ev, a4)
	}
	if ev := next(t, w); ev == nil || ev.Turn != "t-d" || ev.Name != "running" || ev.Seq != d1 || ev.MsgID != "t-d.running" {
		t.Fatalf("after the marker: %+v, want the new turn t-d's running at %d", ev, d1)
	}
}

// A watch of logs that hold nothing sends the marker at once, and then
// every append.
func TestWatchOfEmptyLogsSendsTheMarkerFirst(t *testing.T) {
	l, _ := newLog(t, topology.DefaultConfig())
	w := watch(t, l)
	if ev := next(t, w); ev != nil {
		t.Fatalf("first update of a watch of empty logs: %+v, want the marker", ev)
	}
	seq := mustAppend(t, l, Append{Turn: "t-1", Event: "running"})
	if ev := next(t, w); ev == nil || ev.Turn != "t-1" || ev.Seq != seq {
		t.Fatalf("after the marker: %+v, want t-1's running at %d", ev, seq)
	}
}

// The events of one turn reach a watch in the order they were appended,
// whatever other turns append in between: a turn's terminal event is the
// last of its events delivered.
func TestAWatchDeliversATurnsEventsInOrder(t *testing.T) {
	l, _ := newLog(t, onePartition())
	ctx := jstest.Ctx(t)
	// One turn with events before the watch starts, then appended during it.
	seq := mustAppend(t, l, Append{Turn: "t-0", Event: "running"})
	w := watch(t, l)
	if initial := untilMarker(t, w); !slices.Equal(seqs(initial), []uint64{seq}) {
		t.Fatalf("before the marker: %v, want t-0's running at %d", seqs(initial), seq)
	}
	events := []string{"running", "awaiting", "started", "completed"}
	turns := []string{"t-0", "t-1", "t-2", "t-3"}
	var wg sync.WaitGroup
	errs := make(chan error, len(turns))
	for _, turn := range turns {
		wg.Go(func() {
			var after uint64
			for i, name := range events {
				if turn == "t-0" && i == 0 {
					after = seq // its running is in the log
					continue
				}
				s, err := l.Append(ctx, Append{Turn: turn, Event: name, After: after})
				if err != nil {
					errs <- err
					return
				}
				after = s
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := map[string][]*Event{}
	for done := 0; done < len(turns); {
		ev := next(t, w)
		if ev == nil {
			t.Fatal("a second marker")
		}
		got[ev.Turn] = append(got[ev.Turn], ev)
		if ev.Name == "completed" {
			done++
		}
	}
	for _, turn := range turns {
		var names []string
		for i, ev := range got[turn] {
			names = append(names, ev.Name)
			if i > 0 && ev.Seq <= got[turn][i-1].Seq {
				t.Errorf("%s: %s at %d delivered after %s at %d", turn, ev.Name, ev.Seq, got[turn][i-1].Name, got[turn][i-1].Seq)
			}
		}
		want := events
		if turn == "t-0" {
			want = events[1:] // its running came before the marker
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s's events delivered as %v, want %v", turn, names, want)
		}
		last, err := l.Last(ctx, turn)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(got[turn]); n == 0 || got[turn][n-1].Seq != last.Seq {
			t.Errorf("%s: the last event delivered is not its last, %s at %d", turn, last.Name, last.Seq)
		}
	}
}

// A watch follows every partition: the marker comes once each of them has
// delivered what it held (one holds nothing), and appends of every
// partition follow it.
func TestWatchFollowsEveryPartition(t *testing.T) {
	const partitions = 4
	l, _ := newLog(t, topology.DefaultConfig())
	if l.Partitions() != partitions {
		t.Fatalf("%d partitions, want %d", l.Partitions(), partitions)
	}
	// Two turns in each of partitions 0 to 2, two events each; partition 3
	// is empty when the watch starts.
	want := map[string]uint64{} // turn: its last event
	for p := range partitions - 1 {
		first := turnInPartition(t, p, partitions)
		for _, turn := range []string{first, turnInPartition(t, p, partitions, first)} {
			s := mustAppend(t, l, Append{Turn: turn, Event: "running"})
			want[turn] = mustAppend(t, l, Append{Turn: turn, Event: "awaiting", After: s})
		}
	}
	w := watch(t, l)
	got := map[string][]*Event{}
	for _, ev := range untilMarker(t, w) {
		if p := topology.TurnLogPartition(ev.Turn, partitions); ev.Seq == 0 || p == partitions-1 {
			t.Errorf("event %+v from partition %d", ev, p)
		}
		got[ev.Turn] = append(got[ev.Turn], ev)
	}
	for turn, last := range want {
		evs := got[turn]
		if len(evs) != 2 || evs[0].Name != "running" || evs[1].Name != "awaiting" || evs[1].Seq != last {
			t.Errorf("%s before the marker: %d events %v, want running then awaiting at %d", turn, len(evs), seqs(evs), last)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d turns before the marker, want %d", len(got), len(want))
	}

	// After it: a new turn in the partition that was empty, and one more
	// event of a turn of partition 1.
	fresh := turnInPartition(t, partitions-1, partitions)
	s := mustAppend(t, l, Append{Turn: fresh, Event: "running"})
	old := turnInPartition(t, 1, partitions)
	s2 := mustAppend(t, l, Append{Turn: old, Event: "completed", After: want[old]})
	after := map[string]uint64{}
	for len(after) < 2 {
		ev := next(t, w)
		if ev == nil {
			t.Fatal("a second marker")
		}
		after[ev.Turn] = ev.Seq
	}
	if after[fresh] != s || after[old] != s2 {
		t.Fatalf("after the marker: %v, want %s at %d and %s at %d", after, fresh, s, old, s2)
	}
}

// Stop ends a watch, even one whose updates nobody reads (more of them
// than its buffer holds), and closes its channel; so does the end of its
// context.
func TestAWatchEnds(t *testing.T) {
	t.Run("Stop ends a watch nobody reads", func(t *testing.T) {
		l, js := newLog(t, onePartition())
		ctx := jstest.Ctx(t)
		// More turns than the watch's buffer, published at once (no
		// compare-and-set needed for a test's first events).
		var acks []jetstream.PubAckFuture
		for i := range 1500 {
			f, err := js.PublishAsync(topology.TurnLogSubject(0, fmt.Sprintf("t-%d", i), "running"), []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			case <-jstest.After(jstest.Wait):
				t.Fatal("no acknowledgement")
			}
		}
		w, err := l.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Let it fill its buffer: the first update is there once it reads.
		jstest.Eventually(t, jstest.Wait, "the watch's buffer filled", func() bool { return len(w.Updates()) == cap(w.Updates()) })
		stopped := make(chan struct{})
		go func() { w.Stop(); close(stopped) }()
		select {
		case <-stopped:
		case <-jstest.After(jstest.Wait):
			t.Fatal("Stop did not return")
		}
		drained(t, w)
	})
	t.Run("the end of its context ends a watch", func(t *testing.T) {
		l, _ := newLog(t, onePartition())
		mustAppend(t, l, Append{Turn: "t-1", Event: "running"})
		ctx, cancel := context.WithCancel(jstest.Ctx(t))
		w, err := l.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if initial := untilMarker(t, w); len(initial) != 1 {
			t.Fatalf("%d events before the marker, want t-1's one", len(initial))
		}
		cancel()
		drained(t, w)
		w.Stop() // after the end: returns
	})
}

// drained reads w's channel until it is closed, failing the test if that
// does not happen in time.
func drained(t *testing.T, w *Watcher) {
	t.Helper()
	timeout := jstest.After(jstest.Wait)
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the watch's channel was not closed")
		}
	}
}

// Purge removes every event of one turn and nothing else (not the events
// of a turn whose id starts with it); the turn can start again.
func TestPurgeRemovesATurnsEvents(t *testing.T) {
	l, js := newLog(t, onePartition())
	ctx := jstest.Ctx(t)
	a := mustAppend(t, l, Append{Turn: "t-a", Event: "running"})
	mustAppend(t, l, Append{Turn: "t-a", Event: "awaiting", After: a})
	b := mustAppend(t, l, Append{Turn: "t-ab", Event: "running"})
	c := mustAppend(t, l, Append{Turn: "t-c", Event: "running"})

	if err := l.Purge(ctx, "t-a"); err != nil {
		t.Fatal(err)
	}
	if ev, err := l.Last(ctx, "t-a"); !errors.Is(err, ErrNoEvents) {
		t.Fatalf("Last of the purged turn: %+v, %v; want ErrNoEvents", ev, err)
	}
	for turn, seq := range map[string]uint64{"t-ab": b, "t-c": c} {
		if ev, err := l.Last(ctx, turn); err != nil || ev.Seq != seq {
			t.Errorf("Last of %s after t-a's purge: %+v, %v; want its event at %d", turn, ev, err, seq)
		}
	}
	s, err := js.Stream(ctx, topology.TurnLogStream(0))
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("%d messages in the log after the purge, want the other turns' 2", n)
	}
	again := mustAppend(t, l, Append{Turn: "t-a", Event: "running", MsgID: "t-a.running.again"})
	if ev, err := l.Last(ctx, "t-a"); err != nil || ev.Seq != again {
		t.Fatalf("t-a started again: %+v, %v; want its running at %d", ev, err, again)
	}
	if err := l.Purge(ctx, "t-none"); err != nil {
		t.Errorf("Purge of a turn without events: %v, want nothing done", err)
	}
	if err := l.Purge(ctx, "t-*"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Purge of a wildcard: %v, want ErrInvalid", err)
	}
	if err := l.Purge(ctx, "t-ab.>"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Purge of a subject filter: %v, want ErrInvalid", err)
	}
	if ev, err := l.Last(ctx, "t-ab"); err != nil || ev.Seq != b {
		t.Errorf("t-ab after the refused purges: %+v, %v", ev, err)
	}
}

// Bind makes a Log of the streams it is given, as topology.OpenTurnLogs
// finds them: as many partitions as streams, a turn in the stream of its
// partition, with the options given; New binds the configuration's
// number, and fails when a stream is missing.
func TestBindUsesTheStreamsItIsGiven(t *testing.T) {
	topo := topology.DefaultConfig()
	topo.TurnLogPartitions = 3
	js := bareJS(t)
	ctx := jstest.Ctx(t)
	if err := Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	streams, err := topology.OpenTurnLogs(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	published := 0
	l := Bind(js, streams, withPublish(func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
		published++
		return js.PublishMsg(ctx, m)
	}))
	if l.Partitions() != 3 {
		t.Fatalf("Partitions: %d, want 3", l.Partitions())
	}
	for p := range 3 {
		turn := turnInPartition(t, p, 3)
		if got := l.Partition(turn); got != p {
			t.Errorf("Partition(%s) = %d, want %d", turn, got, p)
		}
		seq := mustAppend(t, l, Append{Turn: turn, Event: "running"})
		m, err := streams[p].GetMsg(ctx, seq)
		if err != nil || m.Subject != topology.TurnLogSubject(p, turn, "running") {
			t.Errorf("%s's event in %s: %+v, %v", turn, topology.TurnLogStream(p), m, err)
		}
	}
	if published != 3 {
		t.Errorf("%d publishes through the option, want 3", published)
	}

	if n, err := New(ctx, js, topo); err != nil || n.Partitions() != 3 {
		t.Fatalf("New: %v, %v; want 3 partitions", n, err)
	}
	more := topo
	more.TurnLogPartitions = 4
	if _, err := New(ctx, js, more); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("New with a partition the server lacks: %v, want ErrStreamNotFound", err)
	}
}
