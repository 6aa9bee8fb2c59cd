package eventfeed

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// decideStored decides approval id in the bucket as the approver does (a
// compare-and-set of its record, approved), publishing nothing, and
// returns the decided event the approver publishes for it and the
// revision's sequence.
func (w *turns) decideStored(id string) (*schemas.DecidedEvent, uint64) {
	w.t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	rec, rev, err := w.st.Approvals.Mutate(jstest.Ctx(w.t), id, func(a *schemas.ApprovalRecord) error {
		a.Status = schemas.ApprovalApproved
		a.Decision = &schemas.DecisionInfo{DecisionID: "d-" + id, Principal: "cli:alice", Option: schemas.OptionApprove, DecidedAt: now}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return schemas.DecidedOf(rec), rev
}

// publishDecided publishes ev on its approval.decided subject, as the
// approver does after storing the decision (or, with Repeat, as its
// answer to a decision that changed no record), and returns its sequence.
func (w *turns) publishDecided(ev *schemas.DecidedEvent) uint64 {
	w.t.Helper()
	return w.publishRecord(topology.EventSubject(topology.SubjectApprovalDecided, ev.TurnID), topology.DecidedMsgID(ev.ApprovalID)+ev.Repeat, ev)
}

// tick waits until the clock has moved on, so that the next message is
// stored at a later time than the last (an earlier version's id is placed
// in the approvals bucket by time).
func tick(t *testing.T) {
	t.Helper()
	now := time.Now()
	jstest.Eventually(t, jstest.Wait, "the clock moved on", func() bool { return time.Now().After(now) })
}

// through is c as a client sends it back: its SSE id, parsed.
func through(t *testing.T, c Cursor) Cursor {
	t.Helper()
	id, err := ParseCursor(c.String())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// waitFeedSawAt waits until f has received source i up to seq.
func waitFeedSawAt(t *testing.T, f *Feed, i int, seq uint64) {
	t.Helper()
	jstest.Eventually(t, jstest.Scale(20*time.Second), fmt.Sprintf("the feed received #%d of source %d", seq, i), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.seen[i] >= seq
	})
}

// readOwn reads n events of sub, passing over the markers noMore stored
// (a subscriber catching up from before one gets it).
func readOwn(t *testing.T, sub *Sub, n int) []Event {
	t.Helper()
	var out []Event
	for len(out) < n {
		for _, ev := range readN(t, sub, n-len(out)) {
			if !strings.HasSuffix(ev.Subject, ".t-marker") {
				out = append(out, ev)
			}
		}
	}
	return out
}

// sameAs fails t unless evs are the events want stand for (by stream,
// sequence and data) in their order.
func sameAs(t *testing.T, name string, evs, want []Event) {
	t.Helper()
	if k, wk := kinds(t, evs), kinds(t, want); !slices.Equal(k, wk) {
		t.Fatalf("%s: %v, want %v", name, k, wk)
	}
	for i, ev := range evs {
		if w := want[i]; ev.Source != w.Source || ev.Seq != w.Seq || !bytes.Equal(ev.Data, w.Data) {
			t.Fatalf("%s: event %d is %s (%d:%d), want it as %s (%d:%d)", name, i, ev.Subject, ev.Source, ev.Seq, w.Subject, w.Source, w.Seq)
		}
	}
}

// A decision that only its approval's record in the bucket keeps (nothing
// publishes it) reaches a subscriber once, from the bucket: the
// approval.decided event it replaces, byte for byte as the approver
// publishes it, after its request and before its turn's outcome; and so
// it does for subscribers catching up from several places: the position
// before, an earlier version's id there (no approvals place) and a bare
// one, the turn's stream from its first event, after each event.
func TestADecisionOnlyInTheBucketComesOnceInItsPlace(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	live, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	w.event("t-before", 0)
	readN(t, live, 1)
	before, err := f.Position(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tick(t)
	turn := "t-stored"
	_, recs, _ := w.move(turn, 2, true, true)
	var decided []*schemas.DecidedEvent
	var revs []uint64
	for _, a := range recs {
		d, rev := w.decideStored(a.ApprovalID)
		decided, revs = append(decided, d), append(revs, rev)
	}
	w.finish(turn)
	want := []string{"requested " + recs[0].ApprovalID, "requested " + recs[1].ApprovalID,
		"decided " + recs[0].ApprovalID, "decided " + recs[1].ApprovalID, "outcome " + turn}
	got := readN(t, live, len(want))
	if k := kinds(t, got); !slices.Equal(k, want) {
		t.Fatalf("live: %v, want %v", k, want)
	}
	noMore(t, w, live)
	dec := len(before) - 1
	if dec != 1+partitions(t, env) {
		t.Fatalf("a position of %d places, want the events stream, %d turn logs and the approvals", len(before), partitions(t, env))
	}
	for i, ev := range got[2:4] {
		if ev.Source != dec || ev.Seq != revs[i] || ev.ID[dec] != revs[i] || ev.Subject != topology.EventSubject(topology.SubjectApprovalDecided, turn) {
			t.Fatalf("decision %d: %s from stream %d seq %d (id %s), want it from %s #%d", i, ev.Subject, ev.Source, ev.Seq, ev.ID, topology.StreamApprovals, revs[i])
		}
		if w := encoded(t, decided[i]); !bytes.Equal(ev.Data, w) {
			t.Fatalf("decision %d: %x, want the bytes the approver publishes, %x", i, ev.Data, w)
		}
	}
	for _, c := range []struct {
		name string
		o    Options
		want []Event
	}{
		{"from the position before", Options{After: through(t, before)}, got},
		{"from an earlier version's id there", Options{After: through(t, before[:dec])}, got},
		{"from a bare id there", Options{After: Cursor{before[0]}}, got},
		{"the turn's stream", Options{Filters: []string{"tollgate.event.*.*." + turn}}, got},
		{"the turn's decisions from the start", Options{Filters: []string{topology.EventSubject(topology.SubjectApprovalDecided, turn)}}, got[2:4]},
		{"decisions and outcomes", Options{After: before, Filters: []string{topology.SubjectApprovalDecided + "*", topology.SubjectTurnOutcome + "*"}}, got[2:]},
		{"after the first request", Options{After: through(t, got[0].ID)}, got[1:]},
		{"after the second request", Options{After: through(t, got[1].ID)}, got[2:]},
		{"after the first decision", Options{After: through(t, got[2].ID)}, got[3:]},
		{"after the second decision", Options{After: through(t, got[3].ID)}, got[4:]},
	} {
		sub, err := f.Subscribe(context.Background(), c.o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sameAs(t, c.name, readOwn(t, sub, len(c.want)), c.want)
		if c.o.Filters == nil {
			noMore(t, w, sub)
		}
		sub.Close()
	}
}

// While the approver still publishes each decision it stores (and until
// it publishes only its answers to repeated decisions), each decision
// comes once, from the bucket, its published copy passed over; a
// published decided event with Repeat is an event of its own, handed out
// from TOLLGATE_EVENTS; one whose decision the bucket does not hold (no
// record: an earlier version's, or one gone; or a record retired since)
// comes from its copy. Live, from the start and resumed after any event.
func TestADecisionStoredAndPublishedComesOnce(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	live, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	turn := "t-both"
	_, recs, _ := w.move(turn, 3, true, true)
	a, r, d := recs[0].ApprovalID, recs[1].ApprovalID, recs[2].ApprovalID
	ev, _ := w.decideStored(a)
	w.publishDecided(ev)
	ev, _ = w.decideStored(r)
	w.publishDecided(ev)
	repeat := *ev
	repeat.Repeat = "d-again"
	w.publishDecided(&repeat)
	ev, _ = w.decideStored(d)
	w.publishDecided(ev)
	copied, _ := w.await("t-copied", 1, true) // no record in the bucket
	w.decide(copied[0])
	c := copied[0].ApprovalID

	fromBucket := map[string]bool{"decided " + a: true, "decided " + r: true, "decided " + d: true, "repeat " + r: false, "decided " + c: false}
	check := func(name string, evs []Event, want map[string]bool) {
		t.Helper()
		seen := map[string]int{}
		for i, k := range kinds(t, evs) {
			if strings.HasPrefix(k, "requested ") {
				continue
			}
			seen[k]++
			if fb, ok := want[k]; !ok || fb != (evs[i].Source == len(evs[i].ID)-1) {
				t.Fatalf("%s: %s from stream %d, want from the bucket: %v (%v)", name, k, evs[i].Source, fb, ok)
			}
		}
		for k := range want {
			if seen[k] != 1 {
				t.Fatalf("%s: %s came %d times, want once (%v)", name, k, seen[k], seen)
			}
		}
	}
	const n = 9 // 4 requests, 4 decisions, 1 repeat
	got := readN(t, live, n)
	check("live", got, fromBucket)
	noMore(t, w, live)
	all, err := f.Subscribe(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	check("from the start", readOwn(t, all, n), fromBucket)
	noMore(t, w, all)
	all.Close()
	for k := range got[:len(got)-1] {
		sub, err := f.Subscribe(context.Background(), Options{After: through(t, got[k].ID)})
		if err != nil {
			t.Fatal(err)
		}
		rest := readOwn(t, sub, len(got)-k-1)
		key := func(evs []Event) []string {
			var out []string
			for _, ev := range evs {
				out = append(out, fmt.Sprintf("%d:%d:%d", ev.Source, ev.Seq, ev.part))
			}
			slices.Sort(out)
			return out
		}
		if !slices.Equal(key(rest), key(got[k+1:])) {
			t.Fatalf("resumed after %s: %v, want %v", got[k].ID, kinds(t, rest), kinds(t, got[k+1:]))
		}
		noMore(t, w, sub)
		sub.Close()
	}

	// Retired (an earlier version's record gets its TTL so as its batch
	// ends): the bucket holds the decision no more, its copy stands for it.
	retain := store.New(w.b)
	retain.Retain(env.JS, time.Hour)
	if err := retain.Approvals.Retire(jstest.Ctx(t), d); err != nil {
		t.Fatal(err)
	}
	fromBucket["decided "+d] = false
	again, err := f.Subscribe(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	check("from the start, retired", readOwn(t, again, n), fromBucket)
	noMore(t, w, again)
	noMore(t, w, live) // and the rewrite is no event
}

// An id an earlier version handed out (no approvals place, or a bare
// events sequence) resumes every decision once: one whose copy was handed
// out up to it not again; one stored before its event and published after
// it (the id fell in between) from its copy; those stored after it from
// the bucket, copies passed over, whether published or not.
func TestAnEarlierVersionsIDResumesEachDecisionOnce(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	live, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	turn := "t-upgrade"
	_, recs, _ := w.move(turn, 4, true, true)
	id := func(i int) string { return recs[i].ApprovalID }
	position := func() Cursor {
		t.Helper()
		tick(t)
		pos, err := f.Position(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return pos[:len(pos)-1] // as the version before this one wrote it
	}
	ev, _ := w.decideStored(id(0))
	w.publishDecided(ev)
	afterFirst := position() // its events place: the first decision's copy
	tick(t)
	ev, _ = w.decideStored(id(1))
	tick(t)
	w.event("t-mark", 0)
	between := position() // its events place: stored after the second decision, before its copy
	w.publishDecided(ev)
	ev, _ = w.decideStored(id(2))
	w.publishDecided(ev)
	w.decideStored(id(3)) // never published, as the approver will do
	w.finish(turn)

	want := []string{"requested " + id(0), "requested " + id(1), "requested " + id(2), "requested " + id(3),
		"decided " + id(0), topology.EventSubject(topology.SubjectApprovalRequested, "t-mark"), "decided " + id(1), "decided " + id(2), "decided " + id(3), "outcome " + turn}
	// The streams' events merge in any order, the outcome last.
	if k := kinds(t, readN(t, live, len(want))); k[len(k)-1] != want[len(want)-1] || !slices.Equal(sorted(k), sorted(want)) {
		t.Fatalf("live: %v, want %v", k, want)
	}
	noMore(t, w, live)
	for _, c := range []struct {
		name  string
		after Cursor
		want  []string // in any order, but the outcome last
		copy  string   // the decision that comes from its copy
	}{
		{"after the first decision's copy", afterFirst, want[5:], ""},
		{"after the first decision's copy, bare", afterFirst[:1], want[5:], ""},
		{"between the second decision and its copy", between, want[6:], "decided " + id(1)},
		{"between the second decision and its copy, bare", between[:1], want[6:], "decided " + id(1)},
	} {
		sub, err := f.Subscribe(context.Background(), Options{After: through(t, c.after)})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := readOwn(t, sub, len(c.want))
		k := kinds(t, got)
		if k[len(k)-1] != "outcome "+turn || !slices.Equal(sorted(k), sorted(c.want)) {
			t.Fatalf("%s (%s): %v, want %v, the outcome last", c.name, c.after, k, c.want)
		}
		for i, ev := range got {
			if strings.HasPrefix(k[i], "decided ") && (ev.Source == 0) != (k[i] == c.copy) {
				t.Fatalf("%s: %s from stream %d, want from its copy: %v", c.name, k[i], ev.Source, k[i] == c.copy)
			}
		}
		noMore(t, w, sub)
		sub.Close()
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// A turn's outcome that reaches the feed while the bucket's consumer is
// behind (not yet past the turn's decision) is held until the decision is
// handed out.
func TestAnOutcomeWaitsForItsDecisionFromALaggingBucket(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	turn := "t-slowbucket"
	_, recs, _ := w.move(turn, 1, true, true)
	g := holdLog(t, f, topology.ApprovalRevisionSubject(recs[0].ApprovalID))
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_, rev := w.decideStored(recs[0].ApprovalID)
	select {
	case <-g.reached:
	case <-time.After(jstest.Scale(20 * time.Second)):
		t.Fatal("the feed never read the decision")
	}
	w.finish(turn)
	logs := f.logs()
	p := topology.TurnLogPartition(turn, len(logs))
	m, err := logs[p].GetLastMsgForSubject(jstest.Ctx(t), topology.TurnLogSubject(p, turn, store.EventOutcome))
	if err != nil {
		t.Fatal(err)
	}
	waitFeedSawAt(t, f, 1+p, m.Sequence)
	f.mu.Lock()
	n, last := len(sub.ch), f.last[1+p]
	f.mu.Unlock()
	if n != 0 || last >= m.Sequence {
		t.Fatalf("with the decision (#%d) not out: %d events handed out, %s out to %d (the outcome is %d)", rev, n, topology.TurnLogStream(p), last, m.Sequence)
	}
	g.release()
	want := []string{"decided " + recs[0].ApprovalID, "outcome " + turn}
	if k := kinds(t, readN(t, sub, len(want))); !slices.Equal(k, want) {
		t.Fatalf("got %v, want %v", k, want)
	}
	noMore(t, w, sub)
}

// A decision from the bucket that reaches the feed before its request is
// held, and the bucket's later events with it, until the request is out:
// one its turn's log keeps (the log's consumer behind), and one only
// published (a batch an earlier version keeps in tollgate_batches; the
// events stream's consumer behind).
func TestADecisionFromTheBucketWaitsForItsRequest(t *testing.T) {
	for _, logged := range []bool{true, false} {
		t.Run(fmt.Sprintf("logged %v", logged), func(t *testing.T) {
			env, f := newFeed(t)
			w := newTurns(t, env)
			turn := "t-wait"
			p := topology.TurnLogPartition(turn, partitions(t, env))
			subject := topology.TurnLogSubject(p, turn, store.EventAwaiting)
			if !logged {
				subject = topology.EventSubject(topology.SubjectApprovalRequested, turn)
			}
			g := holdLog(t, f, subject)
			sub, err := f.Subscribe(context.Background(), Options{New: true})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			reqs, recs, _ := w.move(turn, 1, logged, true)
			if !logged {
				w.announce(reqs[0])
			}
			select {
			case <-g.reached:
			case <-time.After(jstest.Scale(20 * time.Second)):
				t.Fatal("the feed never read the request")
			}
			_, rev := w.decideStored(recs[0].ApprovalID)
			_, others, _ := w.move("t-other", 1, false, true)
			_, later := w.decideStored(others[0].ApprovalID)
			dec := partitions(t, env) + 1
			waitFeedSawAt(t, f, dec, later)
			f.mu.Lock()
			n, last := len(sub.ch), f.last[dec]
			f.mu.Unlock()
			if n != 0 || last >= rev {
				t.Fatalf("with the request not out: %d events handed out, the bucket out to %d (the decision is %d)", n, last, rev)
			}
			g.release()
			want := []string{"requested " + recs[0].ApprovalID, "decided " + recs[0].ApprovalID, "decided " + others[0].ApprovalID}
			if k := kinds(t, readN(t, sub, len(want))); !slices.Equal(k, want) {
				t.Fatalf("got %v, want %v", k, want)
			}
			noMore(t, w, sub)
		})
	}
}

// A decision stored before its batch moved to awaiting (a standing
// grant's, written decided as the approval is created; the move, which
// keeps its request, comes after) is held until the move is out, live and
// catching up: its request first. Should the move not come (the stage
// stopped before it), the decision goes after a while (requestWait).
func TestADecisionStoredBeforeItsRequestWaitsForTheMove(t *testing.T) {
	env, f := newFeed(t)
	f.requestWait = jstest.Scale(2 * time.Second)
	w := newTurns(t, env)
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	turn := "t-granted"
	b, rev, recs := w.begin(turn, 1)
	a := recs[0]
	a.Status = schemas.ApprovalApproved
	a.Decision = &schemas.DecisionInfo{DecisionID: "d-grant", Principal: "cli:alice", Option: schemas.OptionApprove, DecidedAt: a.RequestedAt}
	decided, err := w.st.Approvals.Create(jstest.Ctx(t), a.ApprovalID, a)
	if err != nil {
		t.Fatal(err)
	}
	dec := partitions(t, env) + 1
	waitFeedSawAt(t, f, dec, decided)
	f.mu.Lock()
	n, last := len(sub.ch), f.last[dec]
	f.mu.Unlock()
	if n != 0 || last >= decided {
		t.Fatalf("with its batch not moved to awaiting: %d events handed out, the bucket out to %d (the decision is %d)", n, last, decided)
	}
	w.moveTo(b, rev, recs, true)
	want := []string{"requested " + a.ApprovalID, "decided " + a.ApprovalID}
	got := readN(t, sub, len(want))
	if k := kinds(t, got); !slices.Equal(k, want) {
		t.Fatalf("live: %v, want %v", k, want)
	}
	if w := encoded(t, schemas.DecidedOf(a)); !bytes.Equal(got[1].Data, w) {
		t.Fatalf("the decision: %x, want %x", got[1].Data, w)
	}
	noMore(t, w, sub)
	all, err := f.Subscribe(context.Background(), Options{Filters: []string{"tollgate.event.*.*." + turn}})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if k := kinds(t, readN(t, all, len(want))); !slices.Equal(k, want) {
		t.Fatalf("from the start: %v, want %v", k, want)
	}

	// A batch that never moves: the decision goes after requestWait.
	_, _, stuck := w.begin("t-stuck", 1)
	stuck[0].Status, stuck[0].Decision = schemas.ApprovalApproved, a.Decision
	if _, err := w.st.Approvals.Create(jstest.Ctx(t), stuck[0].ApprovalID, stuck[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.requestWait+jstest.Scale(20*time.Second))
	defer cancel()
	ev, err := sub.Next(ctx)
	if err != nil || kinds(t, []Event{ev})[0] != "decided "+stuck[0].ApprovalID {
		t.Fatalf("the decision of a batch that never moved: %v, %v", kinds(t, []Event{ev}), err)
	}
}

// Should a decision stored before its request (a standing grant's, written
// decided as the approval is created) wait, at the bucket's head, for an
// awaiting event behind an outcome that waits for a later decision in the
// bucket, the outcome goes first, and nothing is stuck: live and catching
// up.
func TestAnOutcomeAndADecisionInTheBucketWaitingForEachOtherDoNotStick(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	ta, tb, _ := sameLogTurns(partitions(t, env))
	// The bucket's consumer waits at tb's approval until tb has moved to
	// awaiting, so that the feed reads tb's decision with its request in
	// the log (read before, it would not wait for it).
	g := holdLog(t, f, topology.ApprovalRevisionSubject(schemas.ApprovalID(tb, 0)))
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_, ra, _ := w.move(ta, 1, true, true)
	// tb's approval, decided at its creation (a grant's), before tb moves
	// to awaiting.
	early := &schemas.ApprovalRecord{V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(tb, 0), TurnID: tb, SessionID: "s-" + tb,
		CallID: schemas.CallID(tb, 0), Context: turnContext(tb), Tool: "write_file", Args: `{"path":"f0.txt"}`, ArgsDigest: schemas.ArgsDigest(`{"path":"f0.txt"}`),
		PolicyVersion: "p-1", Options: []string{schemas.OptionApprove, schemas.OptionDeny}, Status: schemas.ApprovalPending,
		RequestedAt: time.Now().UTC().Truncate(time.Millisecond), ExpiresAt: time.Now().UTC().Add(time.Hour).Truncate(time.Millisecond)}
	if _, err := w.st.Approvals.Create(jstest.Ctx(t), early.ApprovalID, early); err != nil {
		t.Fatal(err)
	}
	w.decideStored(early.ApprovalID)
	w.decideStored(ra[0].ApprovalID)
	w.finish(ta)
	w.await(tb, 1, true)
	g.release()
	want := []string{"requested " + ra[0].ApprovalID, "outcome " + ta, "requested " + early.ApprovalID, "decided " + early.ApprovalID, "decided " + ra[0].ApprovalID}
	if k := kinds(t, readN(t, sub, len(want))); !slices.Equal(k, want) {
		t.Fatalf("live: %v, want %v", k, want)
	}
	noMore(t, w, sub)
	all, err := f.Subscribe(context.Background(), Options{Filters: []string{"tollgate.event.*.*." + ta, "tollgate.event.*.*." + tb}})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if k := kinds(t, readN(t, all, len(want))); !slices.Equal(k, want) {
		t.Fatalf("from the start: %v, want %v", k, want)
	}
}

// A cursor read for a feed of n streams: this version's (n places), the
// version before's (n-1: no approvals) or a bare events sequence are
// accepted, each place kept, the ones it does not name 0; a split
// position only in a turn log's place (never the events stream's or the
// approvals'), one at most, naming a message and at most a batch's
// calls; any other length refused.
func FuzzPlaceCursor(f *testing.F) {
	for _, s := range []string{"1", "1.2.3.4.5", "1.2.3.4.5.6", "1.2.3.4.5.6.7", "1.281474976710663.0.0.0.9", "1.0.0.0.0.281474976710663",
		"281474976710663", "5.562949953421319.0.0.0", "5.0.0.0.562949953421319.1", "5.1.2.3.281474976710656.0"} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, s string, streams uint8) {
		n := 3 + int(streams)%maxPartitions // the events stream, 1 to 64 turn logs, the approvals
		c, err := ParseCursor(s)
		if err != nil {
			return
		}
		valid := len(c) == n || len(c) == n-1 || len(c) == 1
		splits := 0
		for i, v := range c {
			k, seq := v>>splitShift, v&(1<<splitShift-1)
			if k == 0 {
				continue
			}
			splits++
			if i == 0 || i == n-1 || seq == 0 || k > schemas.MaxCalls {
				valid = false
			}
		}
		valid = valid && splits <= 1
		from, sp, fm, err := placeCursor(slices.Clone(c), n)
		if (err == nil) != valid {
			t.Fatalf("placeCursor(%s, %d): %v, want it accepted: %v", c, n, err, valid)
		}
		if err != nil {
			return
		}
		wantForm := map[int]form{n: formFull, n - 1: formOld, 1: formBare}[len(c)]
		if len(from) != n || fm != wantForm {
			t.Fatalf("placeCursor(%s, %d) = %v, form %d; want %d places, form %d", c, n, from, fm, n, wantForm)
		}
		for i, v := range from {
			switch {
			case i >= len(c):
				if v != 0 {
					t.Fatalf("placeCursor(%s, %d) = %v: place %d, which it does not name, is not 0", c, n, from, i)
				}
			case sp.k > 0 && i == sp.src:
				if c[i] != splitAt(sp.seq, sp.k) || v != sp.seq-1 {
					t.Fatalf("placeCursor(%s, %d): split %+v at %d, from %v", c, n, sp, i, from)
				}
			case v != c[i]:
				t.Fatalf("placeCursor(%s, %d) = %v: place %d changed", c, n, from, i)
			}
		}
		if splits != min(sp.k, 1) {
			t.Fatalf("placeCursor(%s, %d): split %+v, the cursor has %d", c, n, sp, splits)
		}
	})
}
