package eventfeed

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// turnContext is a turn's context as ingest captures it (unsealed: the
// feed reads no authority).
func turnContext(turn string) *schemas.TurnContext {
	return &schemas.TurnContext{V: schemas.TurnContextVersion, SessionID: "s-" + turn, TurnID: turn,
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Display: "Alice", Kind: schemas.SenderUser, Verified: true},
		Transport: "cli", Channel: schemas.Channel{ID: "c-1", Kind: schemas.ChannelDM}, Audience: schemas.AudiencePersonal,
		TrustBoundary: "test", Interactive: true, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
}

// await creates turn's batch in its log with n calls that each wait for an
// approval, and moves it to awaiting as the executor does; keep says
// whether the move keeps the requests (an earlier version's does not). It
// returns the requests as the executor announces them, and the awaiting
// event's sequence.
func (w *turns) await(turn string, n int, keep bool) ([]*schemas.ApprovalRecord, uint64) {
	w.t.Helper()
	reqs, _, seq := w.move(turn, n, keep, false)
	return reqs, seq
}

// move is await; with stored, the approvals' records are created in the
// bucket before the batch moves to awaiting, as the executor does, and
// returned whole.
func (w *turns) move(turn string, n int, keep, stored bool) (reqs, records []*schemas.ApprovalRecord, seq uint64) {
	w.t.Helper()
	b, rev, records := w.begin(turn, n)
	if stored {
		for _, a := range records {
			if _, err := w.st.Approvals.Create(jstest.Ctx(w.t), a.ApprovalID, a); err != nil {
				w.t.Fatal(err)
			}
		}
	}
	for _, a := range records {
		reqs = append(reqs, a.SummaryOnly())
	}
	return reqs, records, w.moveTo(b, rev, records, keep)
}

// begin creates turn's batch in its log, running, with n calls that each
// need an approval, and returns it, its revision and the approvals'
// records (not stored) as the executor makes them.
func (w *turns) begin(turn string, n int) (*schemas.BatchRecord, uint64, []*schemas.ApprovalRecord) {
	w.t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	b := &schemas.BatchRecord{TurnID: turn, SessionID: "s-" + turn, State: schemas.BatchRunning, Context: turnContext(turn),
		Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n), CreatedAt: now, UpdatedAt: now}
	for i := range n {
		args := fmt.Sprintf(`{"path":"f%d.txt"}`, i)
		b.Calls = append(b.Calls, schemas.ToolCall{CallID: schemas.CallID(turn, i), Index: i, Tool: "write_file", Args: args, ArgsDigest: schemas.ArgsDigest(args)})
	}
	rev, err := w.st.Batches.Log.Create(jstest.Ctx(w.t), turn, b)
	if err != nil {
		w.t.Fatal(err)
	}
	var records []*schemas.ApprovalRecord
	for i, c := range b.Calls {
		records = append(records, &schemas.ApprovalRecord{V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, i), TurnID: turn, SessionID: b.SessionID,
			CallID: c.CallID, Context: b.Context, Tool: c.Tool, Args: c.Args, ArgsDigest: c.ArgsDigest, PolicyVersion: "p-1",
			Options: []string{schemas.OptionApprove, schemas.OptionDeny}, Status: schemas.ApprovalPending, RequestedAt: now, ExpiresAt: now.Add(time.Hour)})
	}
	return b, rev, records
}

// moveTo moves b (at revision rev) to awaiting records, keeping them as
// its requests when keep, and returns the awaiting event's sequence.
func (w *turns) moveTo(b *schemas.BatchRecord, rev uint64, records []*schemas.ApprovalRecord, keep bool) uint64 {
	w.t.Helper()
	for i, a := range records {
		b.Approvals[i] = a.ApprovalID
		if keep {
			b.Requested = append(b.Requested, a.AsRequested())
		}
	}
	b.State = schemas.BatchAwaiting
	seq, err := w.st.Batches.Log.Update(jstest.Ctx(w.t), b.TurnID, b, rev)
	if err != nil {
		w.t.Fatal(err)
	}
	return seq
}

// touch writes turn's awaiting batch again, staying awaiting: another
// awaiting event, which requests nothing (a stage keeping a result).
func (w *turns) touch(turn string) {
	w.t.Helper()
	if _, _, err := w.st.Batches.Log.Mutate(jstest.Ctx(w.t), turn, func(b *schemas.BatchRecord) error {
		b.UpdatedAt = b.UpdatedAt.Add(time.Millisecond)
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

// finish ends turn's awaiting batch in its log with its outcome, as the
// redriver does.
func (w *turns) finish(turn string) {
	w.t.Helper()
	if _, _, err := w.st.Batches.Log.Mutate(jstest.Ctx(w.t), turn, func(b *schemas.BatchRecord) error {
		o := outcome(turn)
		b.State, b.Outcome, b.UpdatedAt = schemas.BatchCompleted, o, o.FinishedAt
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

// publishRecord stores r on subject under msgID, as bus.Publish does, and
// returns its sequence.
func (w *turns) publishRecord(subject, msgID string, r schemas.Record) uint64 {
	w.t.Helper()
	data, err := schemas.Encode(r)
	if err != nil {
		w.t.Fatal(err)
	}
	ack, err := w.env.JS.Publish(jstest.Ctx(w.t), subject, data, jetstream.WithMsgID(msgID))
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

// announce publishes a's approval-requested event, as the executor does.
func (w *turns) announce(a *schemas.ApprovalRecord) uint64 {
	return w.publishRecord(topology.EventSubject(topology.SubjectApprovalRequested, a.TurnID), topology.RequestedMsgID(a.ApprovalID), a)
}

// decide publishes a's approval-decided event, as the approver does.
func (w *turns) decide(a *schemas.ApprovalRecord) uint64 {
	now := time.Now().UTC().Truncate(time.Millisecond)
	ev := &schemas.DecidedEvent{ApprovalID: a.ApprovalID, TurnID: a.TurnID, SessionID: a.SessionID, Status: schemas.ApprovalApproved,
		Decision: &schemas.DecisionInfo{DecisionID: "d-" + a.ApprovalID, Principal: "cli:alice", Option: schemas.OptionApprove, DecidedAt: now}, At: now}
	return w.publishRecord(topology.EventSubject(topology.SubjectApprovalDecided, a.TurnID), topology.DecidedMsgID(a.ApprovalID), ev)
}

// encoded is r as published.
func encoded(t *testing.T, r schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kinds names each event: "requested <approval>", "decided <approval>"
// ("repeat <approval>" with Repeat set), "outcome <turn>", else its
// subject.
func kinds(t *testing.T, evs []Event) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		switch {
		case strings.HasPrefix(ev.Subject, topology.SubjectApprovalRequested):
			a, err := schemas.Decode[schemas.ApprovalRecord](ev.Data)
			if err != nil {
				out = append(out, ev.Subject)
				continue
			}
			out = append(out, "requested "+a.ApprovalID)
		case strings.HasPrefix(ev.Subject, topology.SubjectApprovalDecided):
			d, err := schemas.Decode[schemas.DecidedEvent](ev.Data)
			if err != nil {
				t.Fatalf("%s: %v", ev.Subject, err)
			}
			if d.Repeat != "" {
				out = append(out, "repeat "+d.ApprovalID)
				continue
			}
			out = append(out, "decided "+d.ApprovalID)
		case strings.HasPrefix(ev.Subject, topology.SubjectTurnOutcome):
			out = append(out, "outcome "+strings.TrimPrefix(ev.Subject, topology.SubjectTurnOutcome))
		default:
			out = append(out, ev.Subject)
		}
	}
	return out
}

// A request its turn's log keeps, and nothing publishes, reaches a
// subscriber once, from the log: the approval-requested event it replaces,
// byte for byte as the executor publishes it, the requests of one awaiting
// event in its order. Each id but the last is the position before the
// awaiting event.
func TestARequestOnlyInTheLogReachesTheSubscriberOnce(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	turn := "t-logged"
	reqs, seq := w.await(turn, 2, true)
	got := readN(t, sub, 2)
	noMore(t, w, sub)
	p := topology.TurnLogPartition(turn, len(f.logs()))
	for i, ev := range got {
		if ev.Subject != topology.EventSubject(topology.SubjectApprovalRequested, turn) || ev.Source != 1+p || ev.Seq != seq {
			t.Fatalf("event %d: %s from stream %d seq %d, want the request from %s #%d", i, ev.Subject, ev.Source, ev.Seq, topology.TurnLogStream(p), seq)
		}
		if want := encoded(t, reqs[i]); !bytes.Equal(ev.Data, want) {
			t.Fatalf("request %d: %x, want the published bytes %x", i, ev.Data, want)
		}
	}
	if got[0].ID[1+p] != splitAt(seq, 1) || got[1].ID[1+p] != seq {
		t.Fatalf("ids %s, %s: want the first inside %s #%d (after its first request), the last at it", got[0].ID, got[1].ID, topology.TurnLogStream(p), seq)
	}
	// A subscriber filtered to the turn's requests gets them; one filtered
	// to another turn's does not (noMore above read the marker after them).
	mine, err := f.Subscribe(context.Background(), Options{Filters: []string{topology.EventSubject(topology.SubjectApprovalRequested, turn)}})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if k := kinds(t, readN(t, mine, 2)); !slices.Equal(k, []string{"requested " + reqs[0].ApprovalID, "requested " + reqs[1].ApprovalID}) {
		t.Fatalf("the turn's requests from the start: %v", k)
	}
	other, err := f.Subscribe(context.Background(), Options{Filters: []string{"tollgate.event.*.*.t-other", "tollgate.event.*.*.t-marker"}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if ev := readN(t, other, 1)[0]; !strings.HasSuffix(ev.Subject, ".t-marker") {
		t.Fatalf("another turn's stream got %s", ev.Subject)
	}
}

// Each request comes once: from the log when its turn's log keeps it (the
// published copy passed over, also when the batch was written again while
// awaiting), from its published copy when not (an earlier version's move to
// awaiting, a batch with no log), live and from the start.
func TestARequestLoggedAndPublishedComesOnce(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	logged, _ := w.await("t-both", 1, true)
	w.announce(logged[0])
	touched, _ := w.await("t-touched", 1, true)
	w.touch("t-touched")
	w.announce(touched[0])
	old, _ := w.await("t-old", 1, false)
	w.announce(old[0])
	bucketed := *old[0]
	bucketed.TurnID, bucketed.ApprovalID = "t-bucketed", schemas.ApprovalID("t-bucketed", 0)
	w.announce(&bucketed)

	fromLog := map[string]bool{logged[0].ApprovalID: true, touched[0].ApprovalID: true, old[0].ApprovalID: false, bucketed.ApprovalID: false}
	check := func(name string, evs []Event) {
		t.Helper()
		seen := map[string]int{}
		for i, ev := range evs {
			k := kinds(t, evs[i:i+1])[0]
			id, ok := strings.CutPrefix(k, "requested ")
			if !ok {
				t.Fatalf("%s: %s, want requests only", name, k)
			}
			seen[id]++
			if fromLog[id] != (ev.Source > 0) {
				t.Fatalf("%s: request %s from stream %d, want from its log: %v", name, id, ev.Source, fromLog[id])
			}
		}
		for id := range fromLog {
			if seen[id] != 1 {
				t.Fatalf("%s: request %s came %d times, want once (%v)", name, id, seen[id], seen)
			}
		}
	}
	check("live", readN(t, sub, len(fromLog)))
	noMore(t, w, sub)
	all, err := f.Subscribe(context.Background(), Options{Filters: []string{topology.SubjectApprovalRequested + "*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	check("from the start", readN(t, all, len(fromLog)))
	noMore(t, w, all)
}

// A subscriber catching up from a position before a turn's move to
// awaiting (an event's id, a turn's stream from its first event) gets each
// request once, from the log, before its decision, and the outcome last;
// one resuming after the first of an awaiting event's requests gets the
// second, then the rest: each once (a split position: cursor.go).
func TestCatchUpGivesRequestsOnceBeforeTheirDecisions(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	live, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	turn := "t-catch"
	w.event("t-before", 0)
	before, err := f.Position(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	readN(t, live, 1)
	reqs, _ := w.await(turn, 2, true)
	for _, a := range reqs {
		w.announce(a)
	}
	for _, a := range reqs {
		w.decide(a)
	}
	w.finish(turn)
	want := []string{"requested " + reqs[0].ApprovalID, "requested " + reqs[1].ApprovalID,
		"decided " + reqs[0].ApprovalID, "decided " + reqs[1].ApprovalID, "outcome " + turn}
	got := readN(t, live, len(want))
	if k := kinds(t, got); !slices.Equal(k, want) {
		t.Fatalf("live: %v, want %v", k, want)
	}
	for _, ev := range got[:2] {
		if ev.Source == 0 {
			t.Fatalf("a request from its published copy: its log keeps it")
		}
	}
	for _, c := range []struct {
		name string
		o    Options
		want []string
	}{
		{"from the position before", Options{After: before}, want},
		{"the turn's stream", Options{Filters: []string{"tollgate.event.*.*." + turn}}, want},
		{"after the first request", Options{After: got[0].ID}, want[1:]},
		{"after the second request", Options{After: got[1].ID}, want[2:]},
		{"decisions and outcomes only", Options{After: before, Filters: []string{topology.SubjectApprovalDecided + "*", topology.SubjectTurnOutcome + "*"}}, want[2:]},
	} {
		if c.o.After != nil {
			// Through its SSE id, as a client resumes.
			id, err := ParseCursor(c.o.After.String())
			if err != nil {
				t.Fatal(err)
			}
			c.o.After = id
		}
		sub, err := f.Subscribe(context.Background(), c.o)
		if err != nil {
			t.Fatal(err)
		}
		evs := readN(t, sub, len(c.want))
		if k := kinds(t, evs); !slices.Equal(k, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, k, c.want)
		}
		for i, ev := range evs {
			if lv := got[len(want)-len(c.want)+i]; ev.Source != lv.Source || ev.Seq != lv.Seq || !bytes.Equal(ev.Data, lv.Data) {
				t.Fatalf("%s: event %d is %s (%d:%d), live it was %s (%d:%d)", c.name, i, ev.Subject, ev.Source, ev.Seq, lv.Subject, lv.Source, lv.Seq)
			}
		}
		if c.o.Filters == nil {
			noMore(t, w, sub)
		}
		sub.Close()
	}
}

// gate holds the feed's reading of a turn log's message on a subject
// until it is opened.
type gate struct {
	subject string
	reached chan struct{}
	open    chan struct{}
	once    sync.Once
}

// holdLog makes f stop before reading the turn-log message on subject, until
// the gate opens (or the test ends). f must not be following yet.
func holdLog(t *testing.T, f *Feed, subject string) *gate {
	g := &gate{subject: subject, reached: make(chan struct{}, 1), open: make(chan struct{})}
	f.beforeMsg = func(s string) {
		if s != g.subject {
			return
		}
		select {
		case g.reached <- struct{}{}:
		default:
		}
		<-g.open
	}
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// waitFeedSaw waits until f has received TOLLGATE_EVENTS up to seq.
func waitFeedSaw(t *testing.T, f *Feed, seq uint64) {
	t.Helper()
	jstest.Eventually(t, jstest.Scale(20*time.Second), fmt.Sprintf("the feed received event %d", seq), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.seen[0] >= seq
	})
}

// A decision that reaches the feed while its request's turn log is behind
// (its consumer not yet past the awaiting event) is held, and the events
// after it with it, until the request is handed out.
func TestADecisionWaitsForItsRequestFromALaggingLog(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	turn := "t-lag"
	p := topology.TurnLogPartition(turn, partitions(t, env))
	g := holdLog(t, f, topology.TurnLogSubject(p, turn, store.EventAwaiting))
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	reqs, _ := w.await(turn, 1, true)
	select {
	case <-g.reached:
	case <-time.After(jstest.Scale(20 * time.Second)):
		t.Fatal("the feed never read the awaiting event")
	}
	decided := w.decide(reqs[0])
	after := w.event("t-after", 0)
	waitFeedSaw(t, f, after)
	f.mu.Lock()
	n, last := len(sub.ch), f.last[0]
	f.mu.Unlock()
	if n != 0 || last >= decided {
		t.Fatalf("with the request not out: %d events handed out, the events stream out to %d (the decision is %d)", n, last, decided)
	}
	g.release()
	want := []string{"requested " + reqs[0].ApprovalID, "decided " + reqs[0].ApprovalID, topology.EventSubject(topology.SubjectApprovalRequested, "t-after")}
	if k := kinds(t, readN(t, sub, 3)); !slices.Equal(k, want) {
		t.Fatalf("got %v, want %v", k, want)
	}
	noMore(t, w, sub)
}

// partitions is how many turn-log partitions env has.
func partitions(t *testing.T, env *jstest.Env) int {
	t.Helper()
	logs, err := topology.OpenTurnLogs(jstest.Ctx(t), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	return len(logs)
}

// sameLogTurns are two turn ids of the same partition of n turn logs.
func sameLogTurns(n int) (a, b string, p int) {
	p = topology.TurnLogPartition("t-cycle-a", n)
	for i := 0; ; i++ {
		if b := fmt.Sprintf("t-cycle-b%d", i); topology.TurnLogPartition(b, n) == p {
			return "t-cycle-a", b, p
		}
	}
}

// Should the events stream wait, at a decision, for a request its log keeps
// behind an outcome that waits for a later event of its turn, the outcome
// goes first, and nothing is stuck: live and catching up.
func TestAnOutcomeAndADecisionWaitingForEachOtherDoNotStick(t *testing.T) {
	env, f := newFeed(t)
	w := newTurns(t, env)
	ta, tb, p := sameLogTurns(partitions(t, env))
	g := holdLog(t, f, topology.TurnLogSubject(p, ta, store.EventOutcome))
	sub, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	w.endInLog(outcome(ta))
	select {
	case <-g.reached:
	case <-time.After(jstest.Scale(20 * time.Second)):
		t.Fatal("the feed never read the outcome event")
	}
	reqs, _ := w.await(tb, 1, true)
	w.decide(reqs[0])
	late := w.event(ta, 0) // an event of ta stored after its outcome
	waitFeedSaw(t, f, late)
	g.release()
	want := []string{"outcome " + ta, "requested " + reqs[0].ApprovalID, "decided " + reqs[0].ApprovalID, topology.EventSubject(topology.SubjectApprovalRequested, ta)}
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

// A split position (inside an awaiting event's requests) is accepted only
// as the feed makes it: in a turn log's place, once, naming a message and
// at most as many requests as a batch has calls.
func TestSplitPositionsAreCheckedWhenParsed(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Cursor
		ok   bool
		want split
	}{
		{"no split", Cursor{5, 3, 0, 9}, true, split{}},
		{"after the first of the requests at 7", Cursor{5, splitAt(7, 1), 0, 9}, true, split{src: 1, seq: 7, k: 1}},
		{"in the last partition's place", Cursor{5, 3, splitAt(7, 2), 9}, true, split{src: 2, seq: 7, k: 2}},
		{"in the events stream's place", Cursor{splitAt(7, 1), 3, 0, 9}, false, split{}},
		{"in the approvals' place", Cursor{5, 3, 0, splitAt(9, 1)}, false, split{}},
		{"two splits", Cursor{5, splitAt(7, 1), splitAt(9, 2), 9}, false, split{}},
		{"at no message", Cursor{5, splitAt(0, 1), 0, 9}, false, split{}},
		{"more requests than calls", Cursor{5, splitAt(7, 33), 0, 9}, false, split{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := slices.Clone(tc.c)
			sp, err := splitOf(from)
			if (err == nil) != tc.ok || sp != tc.want {
				t.Fatalf("splitOf(%s) = %+v, %v; want %+v, ok %v", tc.c, sp, err, tc.want, tc.ok)
			}
			if tc.ok && sp.k > 0 && from[sp.src] != sp.seq-1 {
				t.Fatalf("the position is %d, want the one before the message, %d", from[sp.src], sp.seq-1)
			}
		})
	}
}
