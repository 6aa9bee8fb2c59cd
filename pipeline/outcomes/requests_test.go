package outcomes_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/schemas"
)

// reader records, in order, what a follower with requests handed over:
// "request <approval>" and "outcome <turn>".
type reader struct {
	mu   sync.Mutex
	seen []string
}

func (r *reader) requests(_ context.Context, reqs []*schemas.ApprovalRecord, _ jetstream.Msg) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range reqs {
		r.seen = append(r.seen, "request "+a.ApprovalID)
	}
	return nil
}

func (r *reader) outcome(_ context.Context, o *schemas.TurnOutcome, _ jetstream.Msg) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "outcome "+o.TurnID)
	return nil
}

// count is how many times what was handed over; at is where it first was
// (-1: never).
func (r *reader) count(what string) (n, at int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at = -1
	for i, s := range r.seen {
		if s == what {
			if n++; at < 0 {
				at = i
			}
		}
	}
	return n, at
}

// startReader starts a follower named "reader", with requests when r is
// set, until the test ends or stop is called.
func (f *fixture) startReader(t *testing.T, r *reader) (fl *outcomes.Follower, stop func()) {
	t.Helper()
	cfg := outcomes.Config{Component: "reader", Durable: "reader", JS: f.env.JS, Handler: f.heard.handle,
		Logger: pipelinetest.Logger(), Metrics: f.metrics}
	if r != nil {
		cfg.Handler, cfg.Requests = r.outcome, r.requests
	}
	return f.run(t, cfg)
}

// await creates turn's batch in its log, with one call that needs an
// approval, and moves it to awaiting as the executor does; keep says
// whether the move keeps the request (an earlier version's does not). It
// returns the request as announced.
func (f *fixture) await(t *testing.T, turn string, keep bool) *schemas.ApprovalRecord {
	t.Helper()
	ctx := context.Background()
	b := record(turn, schemas.BatchRunning)
	rev, err := f.batches.Create(ctx, turn, b)
	if err != nil {
		t.Fatal(err)
	}
	call := b.Calls[0]
	a := &schemas.ApprovalRecord{V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: b.SessionID,
		CallID: call.CallID, Tool: call.Tool, Args: call.Args, ArgsDigest: call.ArgsDigest, Options: []string{schemas.OptionApprove, schemas.OptionDeny},
		Status: schemas.ApprovalPending, RequestedAt: time.Now().UTC()}
	b.State, b.Approvals[0] = schemas.BatchAwaiting, a.ApprovalID
	if keep {
		b.Requested = []*schemas.ApprovalRecord{a.AsRequested()}
	}
	if _, err := f.batches.Update(ctx, turn, b, rev); err != nil {
		t.Fatal(err)
	}
	return a
}

// finish ends an awaiting turn with its outcome, as the redriver does.
func (f *fixture) finish(t *testing.T, turn string) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := f.batches.Mutate(ctx, turn, func(b *schemas.BatchRecord) error {
		b.State = schemas.BatchCompleted
		b.Outcome = outcomeOf(b)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func publishedRequest(t *testing.T, fl *outcomes.Follower, a *schemas.ApprovalRecord) {
	t.Helper()
	if err := fl.PublishedRequest(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
}

// Every request reaches a reader of requests once, before its turn's
// outcome: from the turn's log when the follower's consumer delivers it,
// otherwise from its published copy.
func TestEachRequestReachesTheReaderOnceBeforeItsOutcome(t *testing.T) {
	f := newFixture(t)
	before := f.await(t, schemas.TurnID("cli", "awaiting-before-the-reader"), true) // the stages upgraded first
	r := &reader{}
	fl, _ := f.startReader(t, r)

	logged := f.await(t, schemas.TurnID("cli", "in-the-log"), true)
	jstest.Eventually(t, wait, "the log's request is handed over", func() bool { n, _ := r.count("request " + logged.ApprovalID); return n == 1 })
	publishedRequest(t, fl, logged) // its published copy: dropped
	f.finish(t, logged.TurnID)

	publishedRequest(t, fl, before) // stored before the consumer started: handed over from its copy
	old := f.await(t, schemas.TurnID("cli", "an-earlier-versions"), false)
	publishedRequest(t, fl, old) // its log keeps no request: its copy is the request
	bucketed := f.await(t, schemas.TurnID("cli", "kept-in-the-bucket"), false)
	bucketed.TurnID = schemas.TurnID("cli", "no-log-at-all")
	bucketed.ApprovalID = schemas.ApprovalID(bucketed.TurnID, 0)
	publishedRequest(t, fl, bucketed) // no log: its copy is the request

	// A later request and outcome, handed over from the log, then the
	// absences and the order.
	marker := f.await(t, schemas.TurnID("cli", "marker"), true)
	f.finish(t, marker.TurnID)
	jstest.Eventually(t, wait, "the marker's outcome", func() bool { n, _ := r.count("outcome " + marker.TurnID); return n == 1 })
	for _, a := range []*schemas.ApprovalRecord{before, logged, old, bucketed, marker} {
		if n, _ := r.count("request " + a.ApprovalID); n != 1 {
			t.Errorf("request %s (%s) handed over %d times, want once; seen %v", a.ApprovalID, a.TurnID, n, r.seen)
		}
	}
	for _, a := range []*schemas.ApprovalRecord{logged, marker} {
		_, req := r.count("request " + a.ApprovalID)
		if n, out := r.count("outcome " + a.TurnID); n != 1 || out < req {
			t.Errorf("turn %s: outcome %d times at %d, its request at %d; want once, after the request", a.TurnID, n, out, req)
		}
	}
	if n, _ := r.count("outcome " + old.TurnID); n != 0 {
		t.Errorf("an awaiting turn's outcome handed over %d times", n)
	}
}

// A reader that followed outcomes only, started again following requests
// too, keeps its consumers' place: a request stored while it was stopped
// reaches it (from the log, its copy, or both: never not at all), one
// stored after reaches it once from the log, and no outcome is handed
// over again.
func TestAnOutcomeReaderExtendedToRequestsLosesNone(t *testing.T) {
	f := newFixture(t)
	_, stop := f.startReader(t, nil)
	first := f.end(t, schemas.TurnID("cli", "ended-first"))
	jstest.Eventually(t, wait, "the first outcome", func() bool { return f.heard.count(first.TurnID) == 1 })
	stop()

	meanwhile := f.await(t, schemas.TurnID("cli", "awaiting-while-stopped"), true)
	r := &reader{}
	fl, _ := f.startReader(t, r)
	for i, spec := range fl.Consumers() {
		c := spec.Config
		if c.Durable != outcomes.Durable("reader", i) || c.FilterSubject != "" || len(c.FilterSubjects) != 2 ||
			c.FilterSubjects[1] != topology.TurnLogAwaitingFilter(i) || c.Metadata[outcomes.RequestsFromKey] == "" {
			t.Fatalf("consumer %d: %+v, want its outcome and awaiting events, from a recorded sequence", i, c)
		}
	}
	publishedRequest(t, fl, meanwhile)
	after := f.await(t, schemas.TurnID("cli", "awaiting-after"), true)
	publishedRequest(t, fl, after)
	f.finish(t, after.TurnID)
	jstest.Eventually(t, wait, "the later turn's outcome", func() bool { n, _ := r.count("outcome " + after.TurnID); return n == 1 })
	if n, _ := r.count("request " + meanwhile.ApprovalID); n < 1 || n > 2 {
		t.Errorf("the request stored while stopped handed over %d times, want once or twice", n)
	}
	if n, _ := r.count("request " + after.ApprovalID); n != 1 {
		t.Errorf("the request stored after handed over %d times, want once", n)
	}
	if n, _ := r.count("outcome " + first.TurnID); n != 0 {
		t.Errorf("the outcome handed over before the restart came again %d times", n)
	}
}
