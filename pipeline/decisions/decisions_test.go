package decisions_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

const wait = pipelinetest.Wait

// heard records what a follower handed over: each decision's encoding,
// by approval, and the subject of the message that carried it.
type heard struct {
	mu       sync.Mutex
	seen     []string // approval ids, in order
	encoded  map[string][][]byte
	subjects map[string][]string
	panicOn  string // the handler panics on this approval's first delivery
}

func newHeard() *heard {
	return &heard{encoded: map[string][][]byte{}, subjects: map[string][]string{}}
}

func (h *heard) handle(_ context.Context, ev *schemas.DecidedEvent, m jetstream.Msg) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.ApprovalID == h.panicOn {
		h.panicOn = ""
		panic("a handler that panics")
	}
	b, err := schemas.Encode(ev)
	if err != nil {
		return err
	}
	h.seen = append(h.seen, ev.ApprovalID)
	h.encoded[ev.ApprovalID] = append(h.encoded[ev.ApprovalID], b)
	subject := ""
	if m != nil {
		subject = m.Subject()
	}
	h.subjects[ev.ApprovalID] = append(h.subjects[ev.ApprovalID], subject)
	return nil
}

// count is how many times approval id's decision was handed over.
func (h *heard) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.encoded[id])
}

func (h *heard) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

type fixture struct {
	env       *jstest.Env
	approvals store.Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]
	metrics   *runner.Metrics
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := jstest.Start(t)
	return &fixture{env: env, approvals: store.New(env.Buckets).Approvals, metrics: runner.NewMetrics(nil)}
}

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// pending is the pending approval of call 0 of turn, as the executor
// writes it.
func pending(turn string) *schemas.ApprovalRecord {
	args := `{"path":"a.txt"}`
	return &schemas.ApprovalRecord{
		V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: "s1", CallID: schemas.CallID(turn, 0),
		Context: &schemas.TurnContext{
			V: schemas.TurnContextVersion, SessionID: "s1", TurnID: turn, Transport: "slack",
			Requester: schemas.Requester{Principal: "slack:U1", SenderID: "U1", Kind: schemas.SenderUser, Verified: true},
			Channel:   schemas.Channel{ID: "D1", Kind: schemas.ChannelDM}, Audience: schemas.AudiencePersonal,
			TrustBoundary: "acme", Interactive: true, CreatedAt: now,
		},
		Tool: "write_file", Args: args, ArgsDigest: schemas.ArgsDigest(args), PolicyVersion: "p1",
		Options: []string{schemas.OptionApprove, schemas.OptionDeny}, Status: schemas.ApprovalPending, RequestedAt: now,
	}
}

// create writes a as the executor creates it.
func (f *fixture) create(t *testing.T, a *schemas.ApprovalRecord) uint64 {
	t.Helper()
	rev, err := f.approvals.Create(jstest.Ctx(t), a.ApprovalID, a)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// decide moves approval id, pending at rev, to status as the approver
// does (a compare-and-set; a vote first when vote is set) and returns the
// decided record and the revision that holds it.
func (f *fixture) decide(t *testing.T, id string, rev uint64, status schemas.ApprovalStatus, vote bool) (*schemas.ApprovalRecord, uint64) {
	t.Helper()
	ctx := jstest.Ctx(t)
	rec, _, err := f.approvals.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if vote {
		rec.Votes = []schemas.DecisionInfo{{DecisionID: "d-vote", Principal: "slack:U3", Option: schemas.OptionApprove, DecidedAt: now}}
		if rev, err = f.approvals.Update(ctx, id, rec, rev); err != nil {
			t.Fatal(err)
		}
	}
	rec.Status = status
	rec.Decision = &schemas.DecisionInfo{DecisionID: "d-" + id, Principal: "slack:U2", Option: schemas.OptionApprove, DecidedAt: now.Add(time.Minute), Note: "fine"}
	if rev, err = f.approvals.Update(ctx, id, rec, rev); err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

// start builds and runs a follower of cfg (the fixture's durable
// "reader") until the test ends or stop is called.
func (f *fixture) start(t *testing.T, h *heard, from decisions.From) (fl *decisions.Follower, stop func()) {
	t.Helper()
	fl, err := decisions.New(context.Background(), decisions.Config{
		Component: "reader", Durable: decisions.Durable("reader"), JS: f.env.JS, Handler: h.handle, From: from,
		Logger: pipelinetest.Logger(), Metrics: f.metrics, BaseDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	jstest.EventuallyState(t, wait, "the follower consumes", func() (bool, string) { err := fl.Ready(); return err == nil, fmt.Sprint(err) })
	return fl, stop
}

// caughtUp waits until the reader's consumer has passed every revision
// stored so far.
func (f *fixture) caughtUp(t *testing.T) {
	t.Helper()
	jstest.EventuallyState(t, wait, "the decisions consumer caught up", func() (bool, string) {
		return jstest.CaughtUp(jstest.Ctx(t), f.env.JS, topology.StreamApprovals, decisions.Durable("reader"))
	})
}

func encoded(t *testing.T, r schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A follower made after decisions were recorded (FromAll) hands over each
// decision the bucket holds once, as the approver's decided event of it
// (byte for byte once encoded, its version stamped, no repeat), and then
// each new one: not a pending record, not a vote, not a revision that does
// not decode, not a retire rewrite. A restarted follower keeps its place:
// nothing is handed over again.
func TestEachDecisionIsHandedOverOnceAsItsDecidedEvent(t *testing.T) {
	f := newFixture(t)
	ctx := jstest.Ctx(t)
	voted := pending("t-voted")
	votedRec, _ := f.decide(t, voted.ApprovalID, f.create(t, voted), schemas.ApprovalApproved, true)
	granted := pending("t-granted") // created decided, as a standing grant decides
	granted.Status = schemas.ApprovalApproved
	granted.Decision = &schemas.DecisionInfo{DecisionID: "g-1", Principal: "slack:U1", Option: schemas.OptionApprove, DecidedAt: now}
	f.create(t, granted)
	waiting := pending("t-waiting")
	waitingRev := f.create(t, waiting)
	retired := pending("t-retired") // decided by an earlier version, without a TTL, then retired
	f.decide(t, retired.ApprovalID, f.create(t, retired), schemas.ApprovalDenied, false)
	retain := store.New(f.env.Buckets)
	retain.Retain(f.env.JS, time.Hour)
	if err := retain.Approvals.Retire(ctx, retired.ApprovalID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.env.Buckets.Approvals.Put(ctx, "a-garbage-0", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}

	h := newHeard()
	_, stop := f.start(t, h, decisions.FromAll)
	f.caughtUp(t)
	if got := h.all(); !slices.Equal(got, []string{voted.ApprovalID, granted.ApprovalID}) {
		t.Fatalf("handed over %v, want the voted and the granted decisions, once each", got)
	}
	if got, want := h.encoded[voted.ApprovalID][0], encoded(t, schemas.DecidedOf(votedRec)); !bytes.Equal(got, want) {
		t.Errorf("the handed-over decision differs from the approver's decided event:\n got %x\nwant %x", got, want)
	}
	if ev, err := schemas.Decode[schemas.DecidedEvent](h.encoded[voted.ApprovalID][0]); err != nil || ev.V != schemas.DecidedEventVersion || ev.Repeat != "" || len(ev.Votes) != 1 || ev.Decision.Note != "fine" {
		t.Errorf("the handed-over decision: %+v, %v", ev, err)
	}
	if s := h.subjects[voted.ApprovalID][0]; s != topology.ApprovalRevisionSubject(voted.ApprovalID) {
		t.Errorf("handed over with message %s, want its revision", s)
	}

	stop()
	h2 := newHeard()
	f.start(t, h2, decisions.FromAll)
	f.decide(t, waiting.ApprovalID, waitingRev, schemas.ApprovalExpired, false)
	f.caughtUp(t)
	if got := h2.all(); !slices.Equal(got, []string{waiting.ApprovalID}) {
		t.Fatalf("after a restart the follower handed over %v, want the new decision only", got)
	}
	if n := len(h.all()); n != 2 {
		t.Fatalf("the stopped follower handed over %d decisions, want 2", n)
	}
}

// A follower made FromNow delivers only the decisions recorded after its
// consumer was made (replicas made together agree on where it starts), and
// takes an earlier one from its published copy: Published hands a
// published decision over exactly when the consumer does not deliver it
// (decided before the start, no record, a retire rewrite: at worst twice),
// never one that repeats a recorded decision, never one the consumer
// delivers or will (a pending record).
func TestAFollowerFromNowTakesEarlierDecisionsFromTheirPublishedCopies(t *testing.T) {
	f := newFixture(t)
	ctx := jstest.Ctx(t)
	early := pending("t-early")
	earlyRec, _ := f.decide(t, early.ApprovalID, f.create(t, early), schemas.ApprovalApproved, false)
	rewritten := pending("t-rewritten") // decided by an earlier version without a TTL; retired later
	rewrittenRec, _ := f.decide(t, rewritten.ApprovalID, f.create(t, rewritten), schemas.ApprovalApproved, false)

	h := newHeard()
	fl, _ := f.start(t, h, decisions.FromNow)
	replica, err := decisions.New(ctx, decisions.Config{Component: "reader", Durable: decisions.Durable("reader"), JS: f.env.JS,
		Handler: newHeard().handle, From: decisions.FromAll, Logger: pipelinetest.Logger(), Metrics: f.metrics})
	if err != nil {
		t.Fatal(err)
	}
	if fl.Start() <= 1 || replica.Start() != fl.Start() {
		t.Fatalf("starts %d and %d: want the replicas to agree on one after the early decision", fl.Start(), replica.Start())
	}

	late := pending("t-late")
	lateRec, lateSeq := f.decide(t, late.ApprovalID, f.create(t, late), schemas.ApprovalDenied, false)
	waiting := pending("t-waiting")
	f.create(t, waiting)
	retain := store.New(f.env.Buckets)
	retain.Retain(f.env.JS, time.Hour)
	if err := retain.Approvals.Retire(ctx, rewritten.ApprovalID); err != nil {
		t.Fatal(err)
	}
	f.caughtUp(t)
	if got := h.all(); !slices.Equal(got, []string{late.ApprovalID}) {
		t.Fatalf("the consumer handed over %v, want only the decision recorded after it was made", got)
	}
	if seq, err := fl.Decision(ctx, late.ApprovalID); err != nil || seq != lateSeq {
		t.Errorf("Decision(late) = %d, %v; want its revision %d", seq, err, lateSeq)
	}
	if seq, err := fl.Decision(ctx, early.ApprovalID); err != nil || seq != 0 {
		t.Errorf("Decision(early) = %d, %v; want 0 (before the start)", seq, err)
	}
	if ok, err := fl.Passed(ctx, lateSeq); err != nil || !ok {
		t.Errorf("Passed(late) = %v, %v after the consumer caught up", ok, err)
	}

	none := &schemas.DecidedEvent{ApprovalID: schemas.ApprovalID("t-none", 0), TurnID: "t-none", SessionID: "s1", Status: schemas.ApprovalApproved, At: now}
	repeat := schemas.DecidedOf(earlyRec)
	repeat.Repeat = "d-again"
	for _, tc := range []struct {
		name   string
		ev     *schemas.DecidedEvent
		handed bool
	}{
		{"decided before the start", schemas.DecidedOf(earlyRec), true},
		{"the answer to a repeat of it", repeat, false},
		{"decided after the start", schemas.DecidedOf(lateRec), false},
		{"still pending in the bucket", &schemas.DecidedEvent{ApprovalID: waiting.ApprovalID, TurnID: waiting.TurnID, Status: schemas.ApprovalApproved, At: now}, false},
		{"no record", none, true},
		{"a retire rewrite in the bucket", schemas.DecidedOf(rewrittenRec), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.count(tc.ev.ApprovalID)
			if err := fl.Published(ctx, tc.ev, nil); err != nil {
				t.Fatal(err)
			}
			if handed := h.count(tc.ev.ApprovalID) > before; handed != tc.handed {
				t.Errorf("Published handed it over: %v, want %v", handed, tc.handed)
			}
		})
	}
}

// A handler that panics is recovered: the decision is dead-lettered
// (HANDLER_PANIC, its revision's bytes) and terminated, and the follower
// hands over the next.
func TestAPanickingHandlerIsDeadLetteredAndTheFollowerMovesOn(t *testing.T) {
	f := newFixture(t)
	ctx := jstest.Ctx(t)
	h := newHeard()
	bad, next := pending("t-bad"), pending("t-next")
	h.panicOn = bad.ApprovalID
	f.start(t, h, decisions.FromAll)
	f.decide(t, bad.ApprovalID, f.create(t, bad), schemas.ApprovalApproved, false)
	f.decide(t, next.ApprovalID, f.create(t, next), schemas.ApprovalApproved, false)
	jstest.Eventually(t, wait, "the next decision handed over", func() bool { return h.count(next.ApprovalID) == 1 })
	dlq, err := f.env.JS.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	var m *jetstream.RawStreamMsg
	jstest.Eventually(t, wait, "the dead letter", func() bool {
		m, err = dlq.GetLastMsgForSubject(ctx, topology.DLQSubject("reader"))
		return err == nil
	})
	if m.Header.Get(runner.HeaderCode) != string(schemas.CodeHandlerPanic) || m.Header.Get(runner.HeaderOriginalSubject) != topology.ApprovalRevisionSubject(bad.ApprovalID) {
		t.Errorf("dead letter headers %v", m.Header)
	}
	if rec, err := schemas.Decode[schemas.ApprovalRecord](m.Data); err != nil || rec.ApprovalID != bad.ApprovalID || rec.Status != schemas.ApprovalApproved {
		t.Errorf("dead letter body: %+v, %v", rec, err)
	}
	f.caughtUp(t)
	if n := h.count(bad.ApprovalID); n != 0 {
		t.Errorf("the decision the handler panicked on was handed over %d more times", n)
	}
}

// EnsureConsumer makes the consumer a follower would (for a reader whose
// user may only pull), once; a follower then binds it and reads back its
// start, after the decisions recorded before it was made.
func TestEnsureConsumerMakesTheFollowersConsumerOnce(t *testing.T) {
	f := newFixture(t)
	ctx := jstest.Ctx(t)
	early := pending("t-early")
	f.decide(t, early.ApprovalID, f.create(t, early), schemas.ApprovalApproved, false)
	for i, want := range []bool{true, false} {
		created, err := decisions.EnsureConsumer(ctx, f.env.JS, decisions.Durable("reader"), decisions.FromNow, 0)
		if err != nil || created != want {
			t.Fatalf("EnsureConsumer #%d = %v, %v; want %v", i+1, created, err, want)
		}
	}
	h := newHeard()
	fl, _ := f.start(t, h, decisions.FromAll) // bound as made: FromNow's start
	late := pending("t-late")
	f.decide(t, late.ApprovalID, f.create(t, late), schemas.ApprovalApproved, false)
	f.caughtUp(t)
	if got := h.all(); !slices.Equal(got, []string{late.ApprovalID}) || fl.Start() <= 1 {
		t.Fatalf("handed over %v from %d, want only the decision recorded after the consumer was made", got, fl.Start())
	}
	c, err := f.env.JS.Consumer(ctx, topology.StreamApprovals, decisions.Durable("reader"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg := c.CachedInfo().Config; cfg.FilterSubject != topology.ApprovalRevisions || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxDeliver != -1 {
		t.Errorf("the consumer made: %+v", cfg)
	}
}
