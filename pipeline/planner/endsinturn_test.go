package planner_test

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
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A planner turn ends in its turn whatever ends it: the planner giving up
// on its entry before recording it, or its context failing to verify. In
// both cases nothing of the turn runs, its one outcome is failed with the
// code, and the session's turns before and after it keep their order.

// plannerKV is the planner's bucket (its turns and steps).
func (f *fixture) plannerKV(ctx context.Context) jetstream.KeyValue {
	f.T.Helper()
	kv, err := f.JS.KeyValue(ctx, topology.BucketPlanner)
	if err != nil {
		f.T.Fatal(err)
	}
	return kv
}

// plannerTurn returns the planner's record of turnID (nil when it has
// none).
func (f *fixture) plannerTurn(turnID string) *schemas.PlannerTurn {
	f.T.Helper()
	ctx, cancel := f.Ctx()
	defer cancel()
	turns := store.Bucket[schemas.PlannerTurn, *schemas.PlannerTurn]{KV: f.plannerKV(ctx)}
	tr, _, err := turns.Get(ctx, turnID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		f.T.Fatal(err)
	}
	return tr
}

// plannerStep reports whether the planner recorded step n of turnID (a
// model answer).
func (f *fixture) plannerStep(turnID string, n int) bool {
	f.T.Helper()
	ctx, cancel := f.Ctx()
	defer cancel()
	steps := store.Bucket[schemas.PlannerStep, *schemas.PlannerStep]{KV: f.plannerKV(ctx)}
	_, _, err := steps.Get(ctx, schemas.PlannerStepKey(turnID, n))
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	if err != nil {
		f.T.Fatal(err)
	}
	return true
}

// plannerConsumed waits until the planner has acknowledged (or
// terminated) every message of its turns consumer up to and including
// seq: proof that it has finished with them.
func (f *fixture) plannerConsumed(seq uint64) {
	f.T.Helper()
	spec := topology.PlannerConsumers()[0]
	jstest.Eventually(f.T, pipelinetest.Wait, "the planner consumed its turns up to the entry", func() bool {
		ctx, cancel := f.Ctx()
		defer cancel()
		c, err := f.JS.Consumer(ctx, spec.Stream, spec.Config.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= seq && info.NumAckPending == 0
	})
}

// entrySeq is the TOLLGATE_TURNS sequence of turnID's (first) entry in the
// cli session's order.
func (f *fixture) entrySeq(session, turnID string) uint64 {
	f.T.Helper()
	for _, m := range f.Messages(topology.StreamTurns, topology.OrderWildcard(schemas.SessionKey("cli", session))) {
		if e, err := turnorder.Stamp(m.Subject, m.Header); err == nil && e.Turn == turnID {
			return m.Seq
		}
	}
	f.T.Fatalf("turn %s has no entry in session %s's order %v", turnID, session, f.Order(session))
	return 0
}

// The planner gives up on (dead-letters) the entry of a loop before it
// recorded the loop's turn: here its first write of the turn fails for
// good, after a call turn has been queued behind the loop. The turn is
// recorded failed with the dead letter's code at the place its entry
// gives it and ended there, so that the call turn, which waits for it,
// runs; the model is never asked about it.
func TestAPlannerEntryDeadLetteredBeforeItsTurnIsRecordedFailsAtItsPlace(t *testing.T) {
	f := start(t, planner.Budget{}, true)
	const session = "doomed"
	doomedText, afterText := "a loop the planner gives up on", "a loop after it"
	f.model.Script(doomedText, plannertest.Reply{Text: "should never be asked"})
	f.model.Script(afterText, plannertest.Reply{Text: "the session went on"})

	// The planner fails its first write of the doomed turn's record (the
	// queued turn accept creates), for good, once release is closed:
	// until then its handler holds the entry, so that the next turn is
	// queued behind a turn that has neither a record nor a batch.
	var (
		doomed      = make(chan string, 1)
		release     = make(chan struct{})
		releaseOnce sync.Once
		mu          sync.Mutex
		doomedTurn  string
		failedWrite int
	)
	open := func() { releaseOnce.Do(func() { close(release) }) }
	defer open()
	planner.SetBeforeTurnWrite(f.Planner, func(ctx context.Context, key string, tr *schemas.PlannerTurn) error {
		if tr.Text != doomedText || tr.State != schemas.PlannerQueued {
			return nil
		}
		mu.Lock()
		if doomedTurn == "" {
			doomedTurn = key
			doomed <- key
		}
		failedWrite++
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return schemas.Errorf(schemas.CodeInvalidInput, "the planner gives up on turn %s before recording it", key)
	})
	runCtx, stopRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Planner.Run(runCtx) }()
	defer func() {
		open()
		stopRun()
		if err := <-done; err != nil {
			t.Errorf("planner: %v", err)
		}
	}()

	first := f.Send(f.Inbound(session, "alice", pipelinetest.Call("echo", `{"text":"first"}`)))
	if o := f.WaitOutcome(first); o.State != schemas.TurnCompleted {
		t.Fatalf("first turn's outcome %+v", o)
	}
	loop := f.say(session, doomedText)
	select {
	case got := <-doomed:
		if got != loop {
			t.Fatalf("the planner's write of %s was failed, want %s's", got, loop)
		}
	case <-time.After(jstest.Scale(pipelinetest.Wait)):
		t.Fatalf("the planner never tried to record turn %s", loop)
	}
	call := f.Send(f.Inbound(session, "alice", pipelinetest.Call("echo", `{"text":"after the loop"}`)))
	f.waitQueued(session, loop, call)
	if tr, b := f.plannerTurn(loop), f.Batch(loop); tr != nil || b != nil {
		t.Fatalf("the doomed turn has a planner record %+v and a batch %+v before the planner gave it up, want neither", tr, b)
	}
	if n := len(f.Outcomes(call)); n != 0 {
		t.Fatal("the call turn ran before the loop placed before it ended")
	}

	open() // the planner gives the entry up
	dl := f.WaitDLQ(planner.Stage, 1)
	if len(dl) != 1 || dl[0].Header.Get(runner.HeaderCode) != string(schemas.CodeInvalidInput) ||
		dl[0].Header.Get(runner.HeaderOriginalSubject) != topology.OrderSubject(topology.OrderPlan, schemas.SessionKey("cli", session)) {
		t.Fatalf("planner dead letters %+v, want the loop's entry, %s", dl, schemas.CodeInvalidInput)
	}
	b, o := f.WaitTerminal(loop)
	if o.State != schemas.TurnFailed || o.Code != schemas.CodeInvalidInput {
		t.Fatalf("the dead-lettered loop's outcome %+v, want failed %s", o, schemas.CodeInvalidInput)
	}
	if seq := f.entrySeq(session, loop); b.State != schemas.BatchFailed || b.Code != schemas.CodeInvalidInput || !b.Plan ||
		b.OrderSeq != seq || b.OrderAfter != first {
		t.Fatalf("the dead-lettered loop's batch is %s %s (plan %v) at %d after %q, want failed %s at its entry %d after %s",
			b.State, b.Code, b.Plan, b.OrderSeq, b.OrderAfter, schemas.CodeInvalidInput, seq, first)
	}
	if tr := f.plannerTurn(loop); tr == nil || tr.State != schemas.PlannerFailed || tr.Code != schemas.CodeInvalidInput ||
		tr.OrderSeq != b.OrderSeq || tr.OrderAfter != first || tr.Step != 0 {
		t.Fatalf("the planner's record of the dead-lettered loop is %+v, want failed %s at its place, no step taken", tr, schemas.CodeInvalidInput)
	}

	f.ranAfter(loop, call)
	if o := f.WaitOutcome(call); o.State != schemas.TurnCompleted || o.Results[0].Output != "after the loop" {
		t.Fatalf("the call turn's outcome %+v", o)
	}
	after := f.say(session, afterText)
	if r := f.waitReply(after); r.Text != "the session went on" {
		t.Fatalf("reply %q", r.Text)
	}
	f.ranAfter(call, after)

	if n := len(f.model.Requests(doomedText)); n != 0 || f.plannerStep(loop, 0) {
		t.Fatalf("the model was asked %d times about the dead-lettered loop (step recorded: %v), want never", n, f.plannerStep(loop, 0))
	}
	if rs := f.replies(loop); len(rs) != 0 {
		t.Fatalf("the dead-lettered loop replied: %+v", rs)
	}
	mu.Lock()
	defer mu.Unlock()
	if failedWrite != 1 {
		t.Fatalf("the planner tried to record the doomed turn queued %d times, want once (the entry is dead-lettered, not redelivered)", failedWrite)
	}
}

// A loop whose TurnContext does not verify (here: widened after it was
// sealed), appended to its session's order behind a call turn that waits
// for a person, is recorded failed at once, and asks the model nothing;
// but it ends in its turn: only after the call turn before it ends. The
// call turn after it runs only once it has ended.
func TestAFailedClosedLoopEndsOnlyInItsTurn(t *testing.T) {
	f := startOrder(t, testPolicy)
	const session = "forged"
	key := schemas.SessionKey("cli", session)
	earlier := f.Send(f.Inbound(session, "alice", pipelinetest.Call("write_file", `{"path":"earlier.txt","content":"1"}`)))
	a := f.WaitPending(schemas.ApprovalID(earlier, 0))

	text := "widen my audience"
	f.model.Script(text, plannertest.Reply{Text: "should never be asked"})
	m := f.Inbound(session, "alice")
	m.Text, m.Calls = text, nil
	at := f.Accept(m) // sealed as ingest seals it
	at.Context.Audience = schemas.AudiencePublic
	data, err := schemas.Encode(at)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := f.Ctx()
	defer cancel()
	w, err := turnorder.New(ctx, f.JS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := w.Append(ctx, turnorder.Append{Kind: topology.OrderPlan, Key: key, Turn: at.TurnID, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	loop := at.TurnID
	if e.After != earlier {
		t.Fatalf("the forged loop's entry follows %q, want %s", e.After, earlier)
	}

	// Failed closed, but its turn has not come: recorded failed, its
	// batch queued behind the call turn, and no outcome once the planner
	// is done with its entry.
	f.plannerConsumed(e.Seq)
	if tr := f.plannerTurn(loop); tr == nil || tr.State != schemas.PlannerFailed || tr.Code != schemas.CodeTurnContextTampered || tr.OrderSeq != e.Seq {
		t.Fatalf("the forged loop's planner record %+v, want failed %s at its entry %d", tr, schemas.CodeTurnContextTampered, e.Seq)
	}
	if n := len(f.Outcomes(loop)); n != 0 {
		t.Fatal("the failed-closed loop ended while the call turn before it still waited for a person")
	}
	f.waitQueued(session, earlier, loop)
	if b := f.Batch(earlier); b.State.Terminal() {
		t.Fatalf("the earlier call turn is %s: the test needs it waiting", b.State)
	}

	later := f.Send(f.Inbound(session, "alice", pipelinetest.Call("echo", `{"text":"later"}`)))
	f.waitQueued(session, loop, later)
	pastOrderWait(t, time.Now())
	if n, k := len(f.Outcomes(loop)), len(f.Outcomes(later)); n != 0 || k != 0 {
		t.Fatalf("while the first call turn waited, the failed-closed loop has %d outcomes and the turn after it %d, want none", n, k)
	}

	f.Decide(a.ApprovalID, schemas.OptionApprove, "alice")
	first := f.WaitOutcome(earlier)
	if first.State != schemas.TurnCompleted {
		t.Fatalf("the earlier call turn's outcome %+v", first)
	}
	b, o := f.WaitTerminal(loop)
	if o.State != schemas.TurnFailed || o.Code != schemas.CodeTurnContextTampered || o.Audience != "" {
		t.Fatalf("the failed-closed loop's outcome %+v, want failed %s going nowhere", o, schemas.CodeTurnContextTampered)
	}
	if o.FinishedAt.Before(first.FinishedAt) {
		t.Fatalf("the failed-closed loop ended at %s, before the turn before it ended at %s",
			o.FinishedAt.Format(time.RFC3339Nano), first.FinishedAt.Format(time.RFC3339Nano))
	}
	if b.State != schemas.BatchFailed || b.OrderSeq != e.Seq || b.OrderAfter != earlier || !b.Plan {
		t.Fatalf("the failed-closed loop's batch is %s (plan %v) at %d after %q, want failed at %d after %s", b.State, b.Plan, b.OrderSeq, b.OrderAfter, e.Seq, earlier)
	}
	f.ranAfter(loop, later)
	if o := f.WaitOutcome(later); o.State != schemas.TurnCompleted || o.Results[0].Output != "later" {
		t.Fatalf("the later call turn's outcome %+v", o)
	}
	if n := len(f.model.Requests(text)); n != 0 || f.plannerStep(loop, 0) {
		t.Fatalf("the model was asked %d times under a context that does not verify, want never", n)
	}
	if rs := f.replies(loop); len(rs) != 0 {
		t.Fatalf("the failed-closed loop replied: %+v", rs)
	}
}
