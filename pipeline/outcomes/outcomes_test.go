package outcomes_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

const wait = 10 * time.Second

// heard records the outcomes a follower handed over, by turn.
type heard struct {
	mu   sync.Mutex
	seen []string
}

func (h *heard) handle(_ context.Context, o *schemas.TurnOutcome, _ jetstream.Msg) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, o.TurnID)
	return nil
}

func (h *heard) count(turn string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, t := range h.seen {
		if t == turn {
			n++
		}
	}
	return n
}

type fixture struct {
	env     *jstest.Env
	batches store.BatchLog
	heard   *heard
	metrics *runner.Metrics
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := jstest.Start(t)
	return &fixture{env: env, batches: store.BatchLog{Log: turnlog.Bind(env.JS, env.Buckets.TurnLogs)}, heard: &heard{}, metrics: runner.NewMetrics(nil)}
}

// follower starts a follower of the fixture's reader, running until the
// test ends or stop is called.
func (f *fixture) follower(t *testing.T, wants func(string) bool) (fl *outcomes.Follower, stop func()) {
	t.Helper()
	return f.run(t, outcomes.Config{Component: "reader", Durable: "reader", JS: f.env.JS, Handler: f.heard.handle,
		Logger: pipelinetest.Logger(), Metrics: f.metrics, Wants: wants})
}

// run starts a follower configured by cfg until the test ends or stop is
// called.
func (f *fixture) run(t *testing.T, cfg outcomes.Config) (fl *outcomes.Follower, stop func()) {
	t.Helper()
	fl, err := outcomes.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	jstest.Eventually(t, wait, "the follower consumes", func() bool { return fl.Ready() == nil })
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("follower: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return fl, stop
}

func record(turn string, state schemas.BatchState) *schemas.BatchRecord {
	call := schemas.ToolCall{CallID: schemas.CallID(turn, 0), Tool: "echo", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`)}
	return &schemas.BatchRecord{TurnID: turn, SessionID: "s-" + turn, State: state, Calls: []schemas.ToolCall{call},
		Approvals: []string{""}, Results: []*schemas.ToolResult{nil}, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
}

func outcomeOf(b *schemas.BatchRecord) *schemas.TurnOutcome {
	return &schemas.TurnOutcome{V: schemas.TurnOutcomeVersion, TurnID: b.TurnID, SessionID: b.SessionID, State: schemas.TurnCompleted, FinishedAt: b.UpdatedAt}
}

// end creates turn's batch in its log and ends it with its outcome, as
// the stages do; it returns the outcome.
func (f *fixture) end(t *testing.T, turn string) *schemas.TurnOutcome {
	t.Helper()
	return f.endWith(t, turn, true)
}

// endWith is end; without keep, the outcome event holds no outcome, as
// the planner of the version before this one ended its loop turns (their
// outcome only published).
func (f *fixture) endWith(t *testing.T, turn string, keep bool) *schemas.TurnOutcome {
	t.Helper()
	ctx := context.Background()
	b := record(turn, schemas.BatchRunning)
	rev, err := f.batches.Create(ctx, turn, b)
	if err != nil {
		t.Fatal(err)
	}
	b.State = schemas.BatchCompleted
	o := outcomeOf(b)
	if keep {
		b.Outcome = o
	}
	if _, err := f.batches.Update(ctx, turn, b, rev); err != nil {
		t.Fatal(err)
	}
	return o
}

// endAsEarlierVersion ends turn's batch in its log as the version before
// outcomes were in the log did: an event named completed, no outcome.
func (f *fixture) endAsEarlierVersion(t *testing.T, turn string) *schemas.TurnOutcome {
	t.Helper()
	b := record(turn, schemas.BatchCompleted)
	data, err := schemas.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.batches.Log.Append(context.Background(), turnlog.Append{Turn: turn, Event: string(schemas.BatchCompleted), Data: data}); err != nil {
		t.Fatal(err)
	}
	return outcomeOf(b)
}

func published(t *testing.T, fl *outcomes.Follower, o *schemas.TurnOutcome) {
	t.Helper()
	if err := fl.Published(context.Background(), o, nil); err != nil {
		t.Fatal(err)
	}
}

// Every outcome reaches the reader once: from the log when the follower's
// consumer delivers it, otherwise from its published copy.
func TestEachOutcomeReachesTheReaderOnce(t *testing.T) {
	f := newFixture(t)
	before := f.end(t, schemas.TurnID("cli", "ended-before-the-reader")) // the stages upgraded first
	fl, _ := f.follower(t, nil)

	logged := f.end(t, schemas.TurnID("cli", "in-the-log"))
	jstest.Eventually(t, wait, "the log's outcome is handed over", func() bool { return f.heard.count(logged.TurnID) == 1 })
	published(t, fl, logged) // its published copy: dropped

	published(t, fl, before) // stored before the consumer started: handed over from its copy
	bucketed := outcomeOf(record(schemas.TurnID("cli", "kept-in-the-bucket"), schemas.BatchCompleted))
	published(t, fl, bucketed) // no log: its copy is the outcome
	old := f.endAsEarlierVersion(t, schemas.TurnID("cli", "ended-by-an-earlier-version"))
	published(t, fl, old) // its log holds no outcome
	loop := f.endWith(t, schemas.TurnID("cli", "a-loop-an-earlier-planner-ended"), false)
	published(t, fl, loop) // its outcome event holds none: passed over, its copy handed over

	// A later outcome, handed over from the log, then the absences.
	marker := f.end(t, schemas.TurnID("cli", "marker"))
	jstest.Eventually(t, wait, "the marker is handed over", func() bool { return f.heard.count(marker.TurnID) == 1 })
	for _, o := range []*schemas.TurnOutcome{before, logged, bucketed, old, loop, marker} {
		if n := f.heard.count(o.TurnID); n != 1 {
			t.Errorf("turn %s handed over %d times, want once", o.TurnID, n)
		}
	}
}

// A follower started again binds its consumers where they are: what it
// missed while stopped comes from the log, and the published copies of
// those outcomes are still dropped.
func TestARestartedFollowerResumesItsConsumers(t *testing.T) {
	f := newFixture(t)
	_, stop := f.follower(t, nil)
	first := f.end(t, schemas.TurnID("cli", "first"))
	jstest.Eventually(t, wait, "the first outcome", func() bool { return f.heard.count(first.TurnID) == 1 })
	stop()

	missed := f.end(t, schemas.TurnID("cli", "while-stopped"))
	fl, _ := f.follower(t, nil)
	jstest.Eventually(t, wait, "the outcome stored while stopped", func() bool { return f.heard.count(missed.TurnID) == 1 })
	published(t, fl, missed)
	published(t, fl, first)
	marker := f.end(t, schemas.TurnID("cli", "marker"))
	jstest.Eventually(t, wait, "the marker", func() bool { return f.heard.count(marker.TurnID) == 1 })
	if a, b := f.heard.count(first.TurnID), f.heard.count(missed.TurnID); a != 1 || b != 1 {
		t.Fatalf("handed over %d and %d times, want once each", a, b)
	}
	for i, spec := range fl.Consumers() {
		if spec.Stream != topology.TurnLogStream(i) || spec.Config.Durable != outcomes.Durable("reader", i) || spec.Config.FilterSubject != topology.TurnLogOutcomeFilter(i) {
			t.Fatalf("consumer %d: %+v", i, spec)
		}
	}
}

// Wants passes over the outcomes of other turns without handing them
// over, and Decode refuses an outcome event that holds no outcome or
// another turn's batch.
func TestWantsAndDecode(t *testing.T) {
	f := newFixture(t)
	step := schemas.PlannerStepTurnID(schemas.TurnID("cli", "loop"), 1)
	f.follower(t, func(turn string) bool { _, _, ok := schemas.PlannerStepOf(turn); return ok })
	other := f.end(t, schemas.TurnID("cli", "not-a-step"))
	mine := f.end(t, step)
	jstest.Eventually(t, wait, "the step's outcome", func() bool { return f.heard.count(mine.TurnID) == 1 })
	marker := f.end(t, schemas.PlannerStepTurnID(schemas.TurnID("cli", "loop"), 2))
	jstest.Eventually(t, wait, "a later step's outcome", func() bool { return f.heard.count(marker.TurnID) == 1 })
	if n := f.heard.count(other.TurnID); n != 0 {
		t.Fatalf("an unwanted turn's outcome handed over %d times", n)
	}

	b := record("t-1", schemas.BatchCompleted)
	data, _ := schemas.Encode(b)
	for name, tc := range map[string]struct {
		turn string
		data []byte
	}{
		"another turn's batch":  {"t-2", data},
		"bytes that are no map": {"t-1", []byte{0xc1}},
	} {
		if _, err := store.DecodeOutcome(tc.turn, tc.data); schemas.CodeOf(err) == "" || errors.Is(err, store.ErrNoOutcome) {
			t.Errorf("%s: Decode = %v, want an error with a code", name, err)
		}
	}
	if _, err := store.DecodeOutcome("t-1", data); !errors.Is(err, store.ErrNoOutcome) {
		t.Errorf("no outcome: Decode = %v, want ErrNoOutcome", err)
	}
	b.Outcome = outcomeOf(b)
	data, _ = schemas.Encode(b)
	if o, err := store.DecodeOutcome("t-1", data); err != nil || o.TurnID != "t-1" {
		t.Fatalf("Decode = %+v, %v", o, err)
	}
}

// Two replicas of a reader starting together each decide where their
// consumers start; the consumer keeps the one of the replica that created
// it, and the other replica reads that back before judging a published
// outcome: an outcome stored between the two decisions is handed over
// once.
func TestReplicasStartingTogetherAgreeOnTheStart(t *testing.T) {
	f := newFixture(t)
	newFollower := func() *outcomes.Follower {
		fl, err := outcomes.New(context.Background(), outcomes.Config{
			Component: "reader", Durable: "reader", JS: f.env.JS, Handler: f.heard.handle,
			Logger: pipelinetest.Logger(), Metrics: f.metrics,
		})
		if err != nil {
			t.Fatal(err)
		}
		return fl
	}
	first := newFollower()
	between := f.end(t, schemas.TurnID("cli", "between-the-two-starts"))
	second := newFollower() // decides a later start: its consumers do not exist yet
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, fl := range []*outcomes.Follower{first, second} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fl.Run(ctx); err != nil {
				t.Errorf("follower: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	jstest.Eventually(t, wait, "both consume", func() bool { return first.Ready() == nil && second.Ready() == nil })
	jstest.Eventually(t, wait, "the outcome stored between the starts", func() bool { return f.heard.count(between.TurnID) >= 1 })
	published(t, second, between)
	published(t, first, between)
	marker := f.end(t, schemas.TurnID("cli", "marker"))
	jstest.Eventually(t, wait, "the marker", func() bool { return f.heard.count(marker.TurnID) == 1 })
	if n := f.heard.count(between.TurnID); n != 1 {
		t.Fatalf("the outcome stored between the two starts was handed over %d times, want once", n)
	}
}

// Stored gives each turn that ended once one outcome, whichever place
// keeps it, and shows any published copy of an outcome the log keeps (this
// version publishes none), equal to it or not, and a repeated one.
func TestStoredGivesEachTurnsOutcomeOnce(t *testing.T) {
	f := newFixture(t)
	ctx := jstest.Ctx(t)
	pub := func(o *schemas.TurnOutcome, id string) {
		t.Helper()
		if err := bus.Publish(ctx, f.env.JS, topology.EventSubject(topology.SubjectTurnOutcome, o.TurnID), id, o); err != nil {
			t.Fatal(err)
		}
	}
	both := f.end(t, schemas.TurnID("cli", "logged-and-published"))
	pub(both, topology.OutcomeMsgID(both.TurnID))
	logged := f.end(t, schemas.TurnID("cli", "logged-only"))
	old := f.endAsEarlierVersion(t, schemas.TurnID("cli", "published-only"))
	pub(old, "")
	loop := f.endWith(t, schemas.TurnID("cli", "an-earlier-planner's-loop"), false)
	pub(loop, "")
	twice := f.end(t, schemas.TurnID("cli", "published-twice"))
	pub(twice, "")
	pub(twice, "") // no message id: stored again, shown once more
	differs := f.end(t, schemas.TurnID("cli", "published-otherwise"))
	other := *differs
	other.State, other.Code = schemas.TurnFailed, schemas.CodeInvalidInput
	pub(&other, "")

	got, err := outcomes.Stored(ctx, f.env.JS)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		turn string
		n    int
	}{{both.TurnID, 2}, {logged.TurnID, 1}, {old.TurnID, 1}, {loop.TurnID, 1}, {twice.TurnID, 3}, {differs.TurnID, 2}} {
		if n := len(got[c.turn]); n != c.n {
			t.Errorf("turn %s: %d outcomes, want %d", c.turn, n, c.n)
		}
	}
	if o := got[differs.TurnID]; len(o) == 2 && (o[0].State != schemas.TurnCompleted || o[1].State != schemas.TurnFailed) {
		t.Errorf("the logged outcome first, then the differing copy: %+v", o)
	}
}
