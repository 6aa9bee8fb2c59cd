package eventfeed

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// turns writes turns' events and outcomes as the stages do.
type turns struct {
	t   *testing.T
	env *jstest.Env
	b   topology.Buckets
	st  *store.Store
}

func newTurns(t *testing.T, env *jstest.Env) *turns {
	b, err := topology.OpenBuckets(jstest.Ctx(t), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	return &turns{t: t, env: env, b: b, st: store.New(b)}
}

// outcome is turn's outcome as a stage builds it.
func outcome(turn string) *schemas.TurnOutcome {
	return &schemas.TurnOutcome{V: schemas.TurnOutcomeVersion, TurnID: turn, SessionID: "s-" + turn, State: schemas.TurnCompleted,
		Results: []schemas.ToolResult{}, FinishedAt: time.Now().UTC().Truncate(time.Millisecond)}
}

// event stores one event of turn (an approval requested) and returns its
// sequence.
func (w *turns) event(turn string, n int) uint64 {
	w.t.Helper()
	ack, err := w.env.JS.Publish(context.Background(), topology.EventSubject(topology.SubjectApprovalRequested, turn), fmt.Appendf(nil, "%d", n))
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

// endInLog ends turn's batch in its log with o: the outcome event.
func (w *turns) endInLog(o *schemas.TurnOutcome) {
	w.t.Helper()
	ctx := jstest.Ctx(w.t)
	b := &schemas.BatchRecord{TurnID: o.TurnID, SessionID: o.SessionID, State: schemas.BatchRunning,
		Calls: []schemas.ToolCall{}, Approvals: []string{}, Results: []*schemas.ToolResult{}, CreatedAt: o.FinishedAt, UpdatedAt: o.FinishedAt}
	rev, err := w.st.Batches.Log.Create(ctx, o.TurnID, b)
	if err != nil {
		w.t.Fatal(err)
	}
	b.State, b.Outcome = schemas.BatchCompleted, o
	if _, err := w.st.Batches.Log.Update(ctx, o.TurnID, b, rev); err != nil {
		w.t.Fatal(err)
	}
}

// publish publishes o on tollgate.event.turn.outcome.<turn>.
func (w *turns) publish(o *schemas.TurnOutcome) {
	w.t.Helper()
	if err := bus.Publish(jstest.Ctx(w.t), w.env.JS, topology.EventSubject(topology.SubjectTurnOutcome, o.TurnID), topology.OutcomeMsgID(o.TurnID), o); err != nil {
		w.t.Fatal(err)
	}
}

// readN reads n events of sub.
func readN(t *testing.T, sub *Sub, n int) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Scale(20*time.Second))
	defer cancel()
	var out []Event
	for len(out) < n {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, ev)
	}
	return out
}

// noMore waits for a later fact (an event stored after everything else),
// then says whether sub had anything before it.
func noMore(t *testing.T, w *turns, sub *Sub) {
	t.Helper()
	w.event("t-marker", 0)
	ev := readN(t, sub, 1)[0]
	if !strings.HasSuffix(ev.Subject, ".t-marker") {
		t.Fatalf("an extra event before the marker: %s (from stream %d, seq %d)", ev.Subject, ev.Source, ev.Seq)
	}
}

// The feed hands each turn's outcome once, as the outcome event it
// replaces, after the turn's other events: from its log when the log
// holds it (its published copy passed over), from the published event
// when not; and a subscriber resuming from any event's id gets exactly the
// events after it.
func TestEachOutcomeComesOnceAfterItsTurnsEvents(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	live, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	const n = 24
	var want []string // per turn: the subjects in order
	for i := range n {
		turn := fmt.Sprintf("t-%02d", i)
		w.event(turn, 0)
		w.event(turn, 1)
		o := outcome(turn)
		switch i % 3 {
		case 0: // this version: in the log and published
			w.endInLog(o)
			w.publish(o)
		case 1: // only in the log (the publish gone)
			w.endInLog(o)
		case 2: // only published (kept in the bucket, or an earlier version)
			w.publish(o)
		}
		want = append(want, turn)
	}
	got := readN(t, live, 3*n)
	noMore(t, w, live)

	check := func(name string, evs []Event) {
		t.Helper()
		pos := map[string][]int{}
		for i, ev := range evs {
			turn := ev.Subject[strings.LastIndexByte(ev.Subject, '.')+1:]
			pos[turn] = append(pos[turn], i)
			if strings.HasPrefix(ev.Subject, topology.SubjectTurnOutcome) {
				o, err := schemas.Decode[schemas.TurnOutcome](ev.Data)
				if err != nil || o.TurnID != turn {
					t.Fatalf("%s: the outcome of %s decodes as %+v, %v", name, turn, o, err)
				}
				if i := turnIndex(turn); i%3 != 2 && ev.Source == 0 {
					t.Fatalf("%s: the outcome of %s came from its published copy, its log holds it", name, turn)
				}
			}
		}
		for _, turn := range want {
			p := pos[turn]
			if len(p) != 3 {
				t.Fatalf("%s: %s has %d events, want its two and its outcome once", name, turn, len(p))
			}
			if last := evs[p[2]]; !strings.HasPrefix(last.Subject, topology.SubjectTurnOutcome) {
				t.Fatalf("%s: the last event of %s is %s, want its outcome", name, turn, last.Subject)
			}
		}
	}
	check("live", got)

	// Each id is a cursor no smaller than the one before, stream by stream.
	for i := 1; i < len(got); i++ {
		for j := range got[i].ID {
			if got[i].ID[j] < got[i-1].ID[j] {
				t.Fatalf("event %d's id %s goes back from %s", i, got[i].ID, got[i-1].ID)
			}
		}
	}
	// From the start, every turn again, in the same per-turn order.
	all, err := f.Subscribe(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	check("from the start", readN(t, all, 3*n))
	all.Close()
	// Resuming after any event gives exactly the events after it.
	for _, k := range []int{0, 1, 7, 3*n/2 + 1, 3*n - 2} {
		sub, err := f.Subscribe(context.Background(), Options{After: got[k].ID})
		if err != nil {
			t.Fatal(err)
		}
		rest := readN(t, sub, 3*n-1-k)
		for i, ev := range rest {
			if w := got[k+1+i]; ev.Source != w.Source || ev.Seq != w.Seq {
				// Merged in another order is allowed; each once is not.
				if !slices.ContainsFunc(got[k+1:], func(g Event) bool { return g.Source == ev.Source && g.Seq == ev.Seq }) {
					t.Fatalf("resumed after %s: %s (stream %d seq %d) was not after it", got[k].ID, ev.Subject, ev.Source, ev.Seq)
				}
			}
		}
		seen := map[[2]uint64]bool{}
		for _, ev := range rest {
			key := [2]uint64{uint64(ev.Source), ev.Seq}
			if seen[key] {
				t.Fatalf("resumed after %s: %s twice", got[k].ID, ev.Subject)
			}
			seen[key] = true
		}
		sub.Close()
	}
}

func turnIndex(turn string) int {
	var i int
	_, _ = fmt.Sscanf(turn, "t-%d", &i)
	return i
}

// The outcome handed out from a log is byte for byte its published copy.
func TestAnOutcomeFromTheLogIsItsPublishedCopy(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	sub, err := f.Subscribe(context.Background(), Options{New: true, Filters: []string{topology.SubjectTurnOutcome + "*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	o := outcome("t-bytes")
	w.endInLog(o)
	ev := readN(t, sub, 1)[0]
	want, err := schemas.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Source == 0 || !bytes.Equal(ev.Data, want) || ev.Subject != topology.EventSubject(topology.SubjectTurnOutcome, o.TurnID) {
		t.Fatalf("got %s from stream %d: %x, want the log's outcome as %x", ev.Subject, ev.Source, ev.Data, want)
	}
}

// A turn's stream (a filter naming the turn, from the first event) reads
// only that turn's partition and ends with its outcome; a subscriber with
// a bare id of an earlier version (a TOLLGATE_EVENTS sequence) gets the
// events after it and the outcomes logged since it was stored.
func TestATurnsStreamAndABareID(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	w.event("t-a", 0)
	w.endInLog(outcome("t-a"))
	// The bare id reads the logs from the time its event was stored: let
	// the clock pass t-a's outcome before that event is stored.
	ended := time.Now()
	jstest.Eventually(t, jstest.Wait, "the clock past t-a's outcome", func() bool { return time.Now().After(ended) })
	mark := w.event("t-b", 0)
	w.event("t-b", 1)
	w.endInLog(outcome("t-b"))
	w.event("t-c", 0)

	turn, err := f.Subscribe(context.Background(), Options{Filters: []string{"tollgate.event.*.*.t-b"}})
	if err != nil {
		t.Fatal(err)
	}
	evs := readN(t, turn, 3)
	turn.Close()
	if !strings.HasPrefix(evs[2].Subject, topology.SubjectTurnOutcome) || evs[0].Seq != mark {
		t.Fatalf("t-b's stream: %v", subjects(evs))
	}

	bare, err := f.Subscribe(context.Background(), Options{After: Cursor{mark}})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	got := subjects(readN(t, bare, 3))
	want := []string{"tollgate.event.approval.requested.t-b", "tollgate.event.turn.outcome.t-b", "tollgate.event.approval.requested.t-c"}
	if !slices.Equal(got, want) {
		t.Fatalf("after bare id %d: %v, want %v", mark, got, want)
	}
	noMore(t, w, bare)
}

func subjects(evs []Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Subject)
	}
	return out
}

func TestCursorStringAndParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Cursor
	}{
		{"42", Cursor{42}},
		{"1234.5.0.17.3", Cursor{1234, 5, 0, 17, 3}},
		{"0.0", Cursor{0, 0}},
		{"18446744073709551615.1", Cursor{^uint64(0), 1}},
	} {
		got, err := ParseCursor(c.in)
		if err != nil || !slices.Equal(got, c.want) || got.String() != c.in {
			t.Errorf("ParseCursor(%q) = %v (%q), %v; want %v", c.in, got, got.String(), err, c.want)
		}
	}
	for _, bad := range []string{"", ".", "1.", ".1", "1..2", "-1", "+1", "1.x", " 1", "0x10", "18446744073709551616", "1e3", strings.Repeat("1.", 70) + "1"} {
		if c, err := ParseCursor(bad); schemas.CodeOf(err) != schemas.CodeInvalidInput {
			t.Errorf("ParseCursor(%q) = %v, %v; want INVALID_INPUT", bad, c, err)
		}
	}
}

func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"1", "1.2.3.4.5", "1.2.3.4.5.6", "5.281474976710663.0.0.0.9", "", "1..", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCursor(s)
		if err != nil {
			if schemas.CodeOf(err) != schemas.CodeInvalidInput {
				t.Fatalf("ParseCursor(%q): %v, want INVALID_INPUT", s, err)
			}
			return
		}
		again, err := ParseCursor(c.String())
		if err != nil || !slices.Equal(again, c) {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, c, c.String(), again, err)
		}
	})
}

func TestLogFilters(t *testing.T) {
	p := topology.TurnLogPartition("t-1", 4)
	every, outcomes, requests := map[int][]string{}, map[int][]string{}, map[int][]string{}
	for i := range 4 {
		every[i] = []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i)}
		outcomes[i], requests[i] = every[i][:1], every[i][1:]
	}
	oneOutcome := maps.Clone(requests)
	oneOutcome[p] = []string{topology.TurnLogSubject(p, "t-1", "outcome"), topology.TurnLogAwaitingFilter(p)}
	for _, c := range []struct {
		name    string
		filters []string
		want    map[int][]string
	}{
		{"every event wants every partition's outcomes and requests", []string{Subjects}, every},
		{"every outcome and request", []string{"tollgate.event.turn.outcome.*", "tollgate.event.approval.requested.*"}, every},
		{"every outcome", []string{"tollgate.event.turn.outcome.*"}, outcomes},
		{"every approval event wants the requests", []string{"tollgate.event.approval.*.*", "tollgate.event.turn.reply.*", "tollgate.event.turn.outcome"}, requests},
		{"a turn's events want its partition's outcome and awaiting events", []string{"tollgate.event.*.*.t-1"}, map[int][]string{p: {topology.TurnLogSubject(p, "t-1", "outcome"), topology.TurnLogSubject(p, "t-1", "awaiting")}}},
		{"a turn's requests", []string{"tollgate.event.approval.requested.t-1", "tollgate.event.approval.decided.*"}, map[int][]string{p: {topology.TurnLogSubject(p, "t-1", "awaiting")}}},
		{"neither", []string{"tollgate.event.approval.decided.*", "tollgate.event.redrive.*.*", "tollgate.event.turn.reply.*", "tollgate.event.turn.outcome", "tollgate.event.approval.requested.t-1.x"}, map[int][]string{}},
		{"a wildcard outcome and a turn's: the wildcard alone", []string{"tollgate.event.turn.outcome.t-1", "tollgate.event.>"}, every},
		{"a turn's outcome, every request", []string{"tollgate.event.turn.outcome.t-1", "tollgate.event.approval.requested.>"}, oneOutcome},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := logFilters(c.filters, 4)
			for i := range 4 {
				if !slices.Equal(got[i], c.want[i]) {
					t.Fatalf("partition %d: %v, want %v", i, got[i], c.want[i])
				}
			}
		})
	}
}

// An outcome event that holds no outcome (an earlier version's planner
// ended its loop turns so, publishing the outcome alone) is passed over,
// and the turn's published outcome handed out, once.
func TestAnOutcomeEventWithoutTheOutcomeLeavesItToThePublishedCopy(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	sub, err := f.Subscribe(context.Background(), Options{New: true, Filters: []string{topology.SubjectTurnOutcome + "*", "tollgate.event.*.*.t-marker"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	o := outcome("t-loop")
	ctx := jstest.Ctx(t)
	b := &schemas.BatchRecord{TurnID: o.TurnID, SessionID: o.SessionID, State: schemas.BatchRunning, Plan: true,
		Calls: []schemas.ToolCall{}, Approvals: []string{}, Results: []*schemas.ToolResult{}, CreatedAt: o.FinishedAt, UpdatedAt: o.FinishedAt}
	rev, err := w.st.Batches.Log.Create(ctx, o.TurnID, b)
	if err != nil {
		t.Fatal(err)
	}
	b.State = schemas.BatchCompleted
	if _, err := w.st.Batches.Log.Update(ctx, o.TurnID, b, rev); err != nil {
		t.Fatal(err)
	}
	w.publish(o)
	ev := readN(t, sub, 1)[0]
	if ev.Source != 0 || ev.Subject != topology.EventSubject(topology.SubjectTurnOutcome, o.TurnID) {
		t.Fatalf("got %s from stream %d, want the published outcome", ev.Subject, ev.Source)
	}
	noMore(t, w, sub)
	// A resume from the start tells it once too.
	all, err := f.Subscribe(context.Background(), Options{Filters: []string{topology.SubjectTurnOutcome + "*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if got := readN(t, all, 1)[0]; got.Source != 0 || got.Seq != ev.Seq {
		t.Fatalf("from the start: %s from stream %d seq %d, want the published copy", got.Subject, got.Source, got.Seq)
	}
}
