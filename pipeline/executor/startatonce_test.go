package executor_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// A turn whose turn has come (its session's earlier turn ended) is
// created running, its call claimed: its log holds two events, running
// and completed, and no queued record, nor any session record, is ever
// written for it.
func TestATurnOfAFreeSessionIsCreatedRunning(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	for i, text := range []string{"first of its session", "second, the session free again"} {
		turn := h.Send(h.Inbound("at-once", "alice", pt.Call("echo", `{"text":"`+text+`"}`)))
		b, out := h.WaitTerminal(turn)
		if out.State != schemas.TurnCompleted || b.Results[0].Output != text {
			t.Fatalf("turn %d: outcome %s, result %+v", i, out.State, b.Results[0])
		}
		if got := h.LogEvents(turn); !slices.Equal(got, []string{"running", "outcome"}) {
			t.Fatalf("turn %d: log events %v, want [running completed]", i, got)
		}
		if c := b.Claims[0]; c == nil || c.Worker == "" {
			t.Fatalf("turn %d: call 0's claim %+v, want the worker that ran it", i, c)
		}
	}
	h.WaitIdle(pt.Executor)
	if s := h.Session("at-once"); s != nil || !h.SessionFree("at-once") {
		t.Fatalf("session record %+v, want none, and the session free", s)
	}
}

// A turn whose predecessor in its session's order has not ended is
// created queued, at its place: its record must exist before the
// predecessor's end looks for it (batch.Engine's wake). It runs once the
// batch ahead of it ends: queued, running, completed.
func TestATurnBehindItsSessionsBatchIsCreatedQueued(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	ahead := h.Send(h.Inbound("busy", "alice", pt.Call("write_file", `{"path":"q.txt","content":"1"}`)))
	id := schemas.ApprovalID(ahead, 0)
	h.WaitPending(id)
	behind := h.Send(h.Inbound("busy", "alice", pt.Call("echo", `{"text":"after"}`)))
	b := h.WaitBatch(behind, "the second turn queued behind the first", func(b *schemas.BatchRecord) bool {
		return b.State == schemas.BatchQueued
	})
	if b.OrderAfter != ahead {
		t.Fatalf("the queued turn waits behind %q, want %s", b.OrderAfter, ahead)
	}
	if got := h.LogEvents(behind); !slices.Equal(got, []string{"queued"}) {
		t.Fatalf("log events of the queued turn %v, want [queued]", got)
	}
	h.Decide(id, schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(behind); b.State != schemas.BatchCompleted || b.Results[0].Output != "after" {
		t.Fatalf("queued turn ended %s %+v", b.State, b.Results[0])
	}
	if got := h.LogEvents(behind); !slices.Equal(got, []string{"queued", "running", "outcome"}) {
		t.Fatalf("log events of the queued turn %v, want [queued running completed]", got)
	}
	if got := h.LogEvents(ahead); !slices.Equal(got, []string{"running", "awaiting", "started", "outcome"}) {
		t.Fatalf("log events of the first turn %v, want [running awaiting started completed]", got)
	}
}

// An executor that stops after it judged the turn's turn come and before
// the batch is created has written nothing: no session record, no batch.
// The redelivered turn creates the batch and runs the call once.
func TestATurnCutOffBeforeItsBatchRunsOnceOnRedelivery(t *testing.T) {
	count := &pt.Counter{ToolName: "free"}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}})
	cut, resume := make(chan string), make(chan struct{})
	var calls atomic.Int32
	executor.SetBeforeCreate(h.Executor, func(turn string) error {
		if calls.Add(1) == 1 {
			cut <- turn
			<-resume
			return errors.New("the executor stops before creating the batch")
		}
		return nil
	})
	turn := h.Send(h.Inbound("cut", "alice", pt.Call("free", `{}`)))
	if got := <-cut; got != turn {
		t.Fatalf("cut off turn %s, want %s", got, turn)
	}
	s, b := h.Session("cut"), h.Batch(turn)
	close(resume)
	if s != nil || b != nil {
		t.Fatalf("cut off: session %+v, batch %+v; want neither written", s, b)
	}
	if b, out := h.WaitTerminal(turn); out.State != schemas.TurnCompleted || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("outcome %s, result %+v", out.State, b.Results[0])
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 || calls.Load() < 2 {
		t.Fatalf("the call ran %d times over %d attempts, want once after the redelivery", n, calls.Load())
	}
	if got := h.LogEvents(turn); !slices.Equal(got, []string{"running", "outcome"}) {
		t.Fatalf("log events %v, want [running completed]", got)
	}
	h.WaitIdle(pt.Executor)
	if !h.SessionFree("cut") {
		t.Fatalf("session %+v, want free", h.Session("cut"))
	}
}

// A turn given up on (dead-lettered) before its batch was created gets
// its batch failed at its place, with the dead letter's code and nothing
// run: its outcome says so, and the session's next turn, which waits for
// it to end, runs.
func TestATurnDeadLetteredBeforeItsBatchIsFailedAtItsPlace(t *testing.T) {
	count := &pt.Counter{ToolName: "free"}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}})
	var doomed atomic.Pointer[string]
	executor.SetBeforeCreate(h.Executor, func(turn string) error {
		if doomed.CompareAndSwap(nil, &turn) || *doomed.Load() == turn {
			return schemas.Errorf(schemas.CodeInvalidInput, "the executor gives up on turn %s", turn)
		}
		return nil
	})
	first := h.Send(h.Inbound("doomed", "alice", pt.Call("free", `{}`)))
	h.WaitDLQ(executor.Stage, 1)
	if p := doomed.Load(); p == nil || *p != first {
		t.Fatalf("gave up on %v, want %s", p, first)
	}
	next := h.Send(h.Inbound("doomed", "alice", pt.Call("echo", `{"text":"next"}`)))
	if b, out := h.WaitTerminal(next); out.State != schemas.TurnCompleted || b.Results[0].Output != "next" || b.OrderAfter != first {
		t.Fatalf("the next turn ended %s %+v after %q", out.State, b.Results[0], b.OrderAfter)
	}
	b, out := h.WaitTerminal(first)
	if out.State != schemas.TurnFailed || b.Code != schemas.CodeInvalidInput || b.OrderSeq == 0 {
		t.Fatalf("the dead-lettered turn ended %s %s at place %d, want failed INVALID_INPUT at its entry's", out.State, b.Code, b.OrderSeq)
	}
	if r := b.Results[0]; r.Status != schemas.ResultFailed || count.Runs(schemas.CallID(first, 0)) != 0 {
		t.Fatalf("the dead-lettered turn's call: %+v, ran %d times; want failed, never run", r, count.Runs(schemas.CallID(first, 0)))
	}
	h.WaitIdle(pt.Executor)
	if !h.SessionFree("doomed") {
		t.Fatal("session not free")
	}
}

// A turn whose predecessor has no batch yet waits: an announcement of it
// (the recovery sweep's, or a repeated one) does not start it, because
// its predecessor has not ended. It runs only after the first one ends.
// (With the session record, the sweep's release once took the missing
// record for a removed one and promoted the queued turn, which then ran
// before the turn ahead of it: make chaos's write kills found it.)
func TestATurnWhosePredecessorHasNoBatchYetWaits(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	// The first turn's executor stops before creating its batch (fails
	// there) until hold is cleared: its message comes back, and
	// meanwhile the second turn is handled.
	var hold atomic.Bool
	hold.Store(true)
	var firstTurn atomic.Pointer[string]
	executor.SetBeforeCreate(h.Executor, func(turn string) error {
		firstTurn.CompareAndSwap(nil, &turn)
		if *firstTurn.Load() == turn && hold.Load() {
			return errors.New("the executor stops before creating the batch")
		}
		return nil
	})
	first := h.Send(h.Inbound("held", "alice", pt.Call("echo", `{"text":"first"}`)))
	second := h.Send(h.Inbound("held", "alice", pt.Call("echo", `{"text":"second"}`)))
	b2 := h.WaitBatch(second, "the second turn queued behind the first, which has no batch", func(b *schemas.BatchRecord) bool {
		return b.State == schemas.BatchQueued
	})
	sess := batch.SessionOf(b2.Context)
	ctx, cancel := h.Ctx()
	defer cancel()
	for range 2 { // the sweep's announcement, twice
		if err := h.Engine.AnnounceBatch(ctx, sess, b2); err != nil {
			t.Fatal(err)
		}
	}
	if its, err := h.Engine.ItsTurn(ctx, b2); err != nil || its {
		t.Fatalf("ItsTurn of the second turn = %v, %v; want false while the first has no batch", its, err)
	}
	b1 := h.Batch(first)
	hold.Store(false)
	if b1 != nil || b2.OrderAfter != first {
		t.Fatalf("batches %+v and %+v; want the first with none and the second queued behind it", b1, b2)
	}
	_, out1 := h.WaitTerminal(first)
	b2, out2 := h.WaitTerminal(second)
	if out1.State != schemas.TurnCompleted || out2.State != schemas.TurnCompleted {
		t.Fatalf("outcomes %s, %s", out1.State, out2.State)
	}
	if started := b2.Claims[0].ClaimedAt; started.Before(out1.FinishedAt) {
		t.Fatalf("the second turn's call was claimed at %v, before the first turn finished at %v", started, out1.FinishedAt)
	}
}
