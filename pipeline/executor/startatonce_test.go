package executor_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// A turn whose session is free takes its session first and is created
// running, its call claimed: its log holds two events, running and
// completed, and no queued record is ever written for it.
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
	if !h.SessionFree("at-once") {
		t.Fatalf("session %+v, want free", h.Session("at-once"))
	}
}

// A turn whose session is held by another batch is created queued, as
// before: a queued turn must have its record before it joins the queue,
// because the queue's promotion reads it. It runs once the batch ahead of
// it ends: queued, running, completed.
func TestATurnBehindItsSessionsBatchIsCreatedQueued(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	ahead := h.Send(h.Inbound("busy", "alice", pt.Call("write_file", `{"path":"q.txt","content":"1"}`)))
	id := schemas.ApprovalID(ahead, 0)
	h.WaitPending(id)
	behind := h.Send(h.Inbound("busy", "alice", pt.Call("echo", `{"text":"after"}`)))
	jstest.Eventually(t, pt.Wait, "the second turn queued behind the first", func() bool {
		s := h.Session("busy")
		return s != nil && s.Active == ahead && slices.Contains(s.Queue, behind)
	})
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

// An executor that stops after the turn took its session and before the
// batch is created leaves the session held by a turn with no record. The
// redelivered turn finds its session held by itself, creates the batch
// and runs the call once.
func TestATurnCutOffBetweenItsSessionAndItsBatchRunsOnceOnRedelivery(t *testing.T) {
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
	if s == nil || s.Active != turn || b != nil {
		t.Fatalf("cut off: session %+v, batch %+v; want the session held by %s and no batch", s, b, turn)
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

// A turn given up on (dead-lettered) after it took its session and before
// its batch was created releases the session: the session's next turn
// runs instead of queuing for good behind a turn with no record.
func TestATurnDeadLetteredBeforeItsBatchReleasesItsSession(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	var doomed atomic.Pointer[string]
	executor.SetBeforeCreate(h.Executor, func(turn string) error {
		if doomed.CompareAndSwap(nil, &turn) || *doomed.Load() == turn {
			return schemas.Errorf(schemas.CodeInvalidInput, "the executor gives up on turn %s", turn)
		}
		return nil
	})
	first := h.Send(h.Inbound("doomed", "alice", pt.Call("echo", `{"text":"never"}`)))
	h.WaitDLQ(executor.Stage, 1)
	if p := doomed.Load(); p == nil || *p != first {
		t.Fatalf("gave up on %v, want %s", p, first)
	}
	next := h.Send(h.Inbound("doomed", "alice", pt.Call("echo", `{"text":"next"}`)))
	if b, out := h.WaitTerminal(next); out.State != schemas.TurnCompleted || b.Results[0].Output != "next" {
		t.Fatalf("the next turn ended %s %+v", out.State, b.Results[0])
	}
	if b := h.Batch(first); b != nil {
		t.Fatalf("the dead-lettered turn has a batch %+v", b)
	}
	h.WaitIdle(pt.Executor)
	if !h.SessionFree("doomed") {
		t.Fatalf("session %+v, want free", h.Session("doomed"))
	}
}

// A session held by a turn whose batch is not created yet is not passed
// on by a release that did not promote that turn: the recovery sweep's
// release of a session with a queued turn (Engine.Release with no turn)
// once took the missing record for a removed one and promoted the queued
// turn, which then ran before the turn ahead of it (make chaos's write
// kills found it). The queued turn runs only after the first one ends.
func TestASessionHeldBeforeItsBatchExistsIsNotPassedOn(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	// The first turn's executor stops between the session and the batch
	// (fails there) until hold is cleared: its message comes back, and
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
	jstest.Eventually(t, pt.Wait, "the second turn queued behind the first, which has no batch", func() bool {
		s := h.Session("held")
		return s != nil && s.Active == first && slices.Contains(s.Queue, second)
	})
	sess := batch.Session{ID: "held", Key: schemas.SessionKey("cli", "held")}
	ctx, cancel := h.Ctx()
	defer cancel()
	for range 2 { // the sweep, twice
		if err := h.Engine.Release(ctx, sess, ""); err != nil {
			t.Fatal(err)
		}
	}
	s, b1, b2 := h.Session("held"), h.Batch(first), h.Batch(second)
	hold.Store(false)
	if s.Active != first || !slices.Equal(s.Queue, []string{second}) || b1 != nil || b2 == nil || b2.State != schemas.BatchQueued {
		t.Fatalf("after the sweep's release: session %+v, batches %+v and %+v; want the first turn holding it with no batch and the second queued", s, b1, b2)
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
