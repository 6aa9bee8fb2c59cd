package redriver_test

import (
	"fmt"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// sweepOptions make the recovery sweep look often and act on anything
// untouched for a moment.
func sweepOptions(count *pt.Counter) pt.Options {
	return pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, SweepInterval: 100 * time.Millisecond, SweepAfter: 300 * time.Millisecond}
}

func sweepActions(h *pt.H, action string) float64 {
	return h.Metric("tollgate_sweep_actions_total", map[string]string{"action": action})
}

func TestSweepRedrivesABatchWhoseDecidedEventWasLost(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, sweepOptions(count))
	turn := h.Send(h.Inbound("lost-decided", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	// Once the batch waits, nothing but a decided event (or the sweep)
	// makes the redriver look at it: the executor announces nothing.
	h.WaitState(turn, schemas.BatchAwaiting)

	// The decision is in the bucket, but its revision never triggered
	// the redriver (a trigger given up on: written here as a rewrite,
	// which the redriver's consumer passes over): only the record knows.
	h.MutateApprovalUnheard(id, func(a *schemas.ApprovalRecord) {
		a.Status = schemas.ApprovalApproved
		a.Decision = &schemas.DecisionInfo{DecisionID: "d-lost", Principal: "cli:alice", Option: schemas.OptionApprove,
			DecidedAt: time.Now().UTC(), Assurance: schemas.AssuranceVerified}
	})
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("batch %s, result %+v", b.State, b.Results[0])
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("the approved call ran %d times, want 1", n)
	}
	if n := len(h.Decisions(turn)); n != 0 {
		t.Fatalf("%d decided events: the test meant to have none", n)
	}
	if sweepActions(h, "redrive") < 1 {
		t.Fatal("the batch completed, but not through the sweep")
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
}

func TestSweepLeavesABatchWaitingForAPersonAlone(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, sweepOptions(count))
	turn := h.Send(h.Inbound("still-waiting", "alice", pt.Call("count", `{}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	h.WaitState(turn, schemas.BatchAwaiting)
	before := len(h.Redrives("deferred", turn))
	// The sweep looks at it more than once (its back-off starts at
	// SweepAfter) and must leave it alone each time.
	jstest.Eventually(t, 10*time.Second, "the sweep looked at the waiting batch twice", func() bool {
		return sweepActions(h, "waiting") >= 2
	})
	if b := h.Batch(turn); b.State != schemas.BatchAwaiting {
		t.Fatalf("a batch waiting for a decision moved to %s", b.State)
	}
	if n := count.Total(); n != 0 {
		t.Fatalf("tool ran %d times without a decision", n)
	}
	if after := len(h.Redrives("deferred", turn)); after != before {
		t.Fatalf("the sweep published %d deferred outcomes for a batch that waits for a person", after-before)
	}
	if n := sweepActions(h, "redrive") + sweepActions(h, "error") + sweepActions(h, "retire"); n != 0 {
		t.Fatalf("%v sweep actions on a batch that needs none", n)
	}
	if h.SessionFree("still-waiting") {
		t.Fatal("the session is free while its turn waits for a person")
	}
}

// An earlier version's session record, left naming a turn that has ended
// (a turn's end wrote nothing when none was queued behind it): the sweep
// retires the idle record, and a turn that comes after runs either way
// (this version writes no session record for it).
func TestSweepRetiresAnIdleSession(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, sweepOptions(count))
	const session = "goes-idle"
	first := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"one"}`)))
	b, _ := h.WaitTerminal(first)
	if b.State != schemas.BatchCompleted {
		t.Fatalf("first turn %s", b.State)
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := h.Store.Sessions.Create(ctx, schemas.SessionKeyOf(b.Context), &schemas.SessionRecord{SessionID: session, Active: first, UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	jstest.Eventually(t, 10*time.Second, "the sweep retired the idle session", func() bool {
		s := h.Session(session)
		return s != nil && s.Active == "" && len(s.Queue) == 0 && sweepActions(h, "retire") >= 1
	})
	second := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"two"}`)))
	if b, _ := h.WaitTerminal(second); b.State != schemas.BatchCompleted || b.Results[0].Output != "two" {
		t.Fatalf("second turn %s %+v", b.State, b.Results[0])
	}
	if n := sweepActions(h, "error"); n != 0 {
		t.Fatalf("%v failed sweep actions", n)
	}
}

// queueBehindAWaitingTurn sends two turns in session: the first waits for
// an approval (and is then looked at by nothing but the sweep, so edits of
// its records are not seen by the normal path), the second, echoing
// "next", is queued behind it. It returns both turn ids.
func queueBehindAWaitingTurn(h *pt.H, session string) (first, second string) {
	h.T.Helper()
	first = h.Send(h.Inbound(session, "alice", pt.Call("count", `{}`)))
	h.WaitState(first, schemas.BatchAwaiting)
	second = h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"next"}`)))
	h.WaitBatch(second, "queued behind the first", func(b *schemas.BatchRecord) bool {
		return b.State == schemas.BatchQueued && b.OrderAfter == first
	})
	return first, second
}

// endAndRunNext ends first of queueBehindAWaitingTurn as no stage would
// (its batch written failed), and waits for second to run.
func endAndRunNext(h *pt.H, first, second string) {
	h.T.Helper()
	h.MutateBatch(first, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchFailed
	})
	waitNextRan(h, second)
}

// waitNextRan waits for second of queueBehindAWaitingTurn to complete.
func waitNextRan(h *pt.H, second string) {
	h.T.Helper()
	if b, _ := h.WaitTerminal(second); b.State != schemas.BatchCompleted || b.Results[0].Output != "next" {
		h.T.Fatalf("queued turn ended %s: %+v", b.State, b.Results[0])
	}
}

// asEarlierVersion makes first and second of queueBehindAWaitingTurn what
// an earlier version left: batches without a place, the session record
// holding first active and queue behind it.
func asEarlierVersion(h *pt.H, session, first string, queue ...string) {
	h.T.Helper()
	for _, turn := range append([]string{first}, queue...) {
		h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.OrderSeq, b.OrderAfter = 0, "" })
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := h.Store.Sessions.Create(ctx, schemas.SessionKey("cli", session), &schemas.SessionRecord{SessionID: session,
		Active: first, Queue: queue, UpdatedAt: time.Now().UTC()}); err != nil {
		h.T.Fatal(err)
	}
}

// watchOnly keeps the sweep's passes from acting during a test: what
// happens is the watch's doing.
func watchOnly(count *pt.Counter) pt.Options {
	return pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, SweepInterval: time.Hour, SweepAfter: time.Hour}
}

// A turn queued behind another in its session's order is woken by the
// redriver's watch of the turn logs when that turn's end is delivered:
// here the end is written without any stage (nobody that ended it could
// announce the next), and the sweep's passes do not act.
func TestAQueuedTurnIsWokenWhenTheWatchDeliversItsPredecessorsEnd(t *testing.T) {
	h := pt.Start(t, watchOnly(&pt.Counter{}))
	first, second := queueBehindAWaitingTurn(h, "watch-wake")
	endAndRunNext(h, first, second)
	if sweepActions(h, "wake") < 1 || sweepActions(h, "announce") != 0 {
		t.Fatalf("the queued turn ran with %v wakes and %v announcements by a pass, want a wake and no pass",
			sweepActions(h, "wake"), sweepActions(h, "announce"))
	}
}

// The turn logs' partitions deliver in no order among themselves: the
// watch may deliver a queued batch after its predecessor's end (here, a
// watch that had not delivered the queued batch when the end came, as a
// redriver started in between). Keeping the batch, it reads the
// predecessor and wakes it.
func TestAQueuedTurnDeliveredAfterItsPredecessorsEndIsWoken(t *testing.T) {
	h := pt.Start(t, watchOnly(&pt.Counter{}))
	first, second := queueBehindAWaitingTurn(h, "late-queued")
	redriver.SetWatchWakes(h.Redriver, false)
	h.MutateBatch(first, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchFailed
	})
	redriver.SweepForget(h.Redriver, second)
	redriver.SetWatchWakes(h.Redriver, true)
	// A later write of the queued batch (as the catch-up of a restarted
	// watch delivers it): the first the watch has of it.
	h.MutateBatch(second, func(b *schemas.BatchRecord) { b.UpdatedAt = time.Now().UTC() })
	waitNextRan(h, second)
	if sweepActions(h, "wake") < 1 {
		t.Fatal("the queued turn ran, but not by the watch's wake")
	}
}

// The wake's loss: a turn ended with a turn queued behind it in its
// session's order, and its wake never came (here: the watch wakes
// nothing, as with a redriver that died after the end's delivery). The
// sweep's pass announces it.
func TestSweepAnnouncesAQueuedTurnWhosePredecessorEndedWithoutWakingIt(t *testing.T) {
	h := pt.Start(t, sweepOptions(&pt.Counter{}))
	redriver.SetWatchWakes(h.Redriver, false)
	first, second := queueBehindAWaitingTurn(h, "cut-wake")
	endAndRunNext(h, first, second)
	if sweepActions(h, "announce") < 1 || sweepActions(h, "wake") != 0 {
		t.Fatal("the queued turn ran, but not through the sweep's pass")
	}
}

// An earlier version's lost ready notice: the first turn ended and its
// release passed the session on in the session record, then the worker
// died before publishing the ready notice. The sweep re-announces it.
func TestSweepAnnouncesAQueuedTurnWhoseReadyNoticeWasLost(t *testing.T) {
	h := pt.Start(t, sweepOptions(&pt.Counter{}))
	const session = "lost-release"
	first, second := queueBehindAWaitingTurn(h, session)
	asEarlierVersion(h, session, second)
	endAndRunNext(h, first, second)
	if sweepActions(h, "release") < 1 {
		t.Fatal("the queued turn ran, but not through the sweep")
	}
}

// A pass looks at no more batches than its cap, longest-due first; the
// others wait for later passes and none is starved.
func TestSweepPassesAreCappedAndStillReachEveryBatch(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, sweepOptions(count))
	redriver.SetSweepMaxLooks(h.Redriver, 1)
	var turns []string
	for i := range 3 {
		turn := h.Send(h.Inbound(fmt.Sprintf("capped-%d", i), "alice", pt.Call("count", `{}`)))
		h.WaitState(turn, schemas.BatchAwaiting)
		turns = append(turns, turn)
	}
	// No decision triggers the redriver: only the sweep can finish them.
	for i, turn := range turns {
		h.MutateApprovalUnheard(schemas.ApprovalID(turn, 0), func(a *schemas.ApprovalRecord) {
			a.Status = schemas.ApprovalApproved
			a.Decision = &schemas.DecisionInfo{DecisionID: fmt.Sprintf("d-capped-%d", i), Principal: "cli:alice", Option: schemas.OptionApprove,
				DecidedAt: time.Now().UTC(), Assurance: schemas.AssuranceVerified}
		})
	}
	for _, turn := range turns {
		if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
			t.Fatalf("batch %s ended %s", turn, b.State)
		}
	}
	if n := sweepActions(h, "redrive"); n < 3 {
		t.Fatalf("%v sweep redrives, want one per batch", n)
	}
	if n := redriver.SweepMostLooks(h.Redriver); n != 1 {
		t.Fatalf("a pass looked at %d batches, cap 1", n)
	}
}

// An earlier version's queued batch in no session queue (its stage never
// took the session for it, or the record was rebuilt without it) behind a
// turn that has ended: the sweep announces it, and its stage takes the
// free session.
func TestSweepAnnouncesAQueuedTurnInNoSessionQueue(t *testing.T) {
	h := pt.Start(t, sweepOptions(&pt.Counter{}))
	const session = "in-no-queue"
	first, second := queueBehindAWaitingTurn(h, session)
	asEarlierVersion(h, session, first)
	h.MutateBatch(second, func(b *schemas.BatchRecord) { b.OrderSeq, b.OrderAfter = 0, "" })
	endAndRunNext(h, first, second)
	if sweepActions(h, "announce") < 1 {
		t.Fatal("the queued turn ran, but not through the sweep's announcement")
	}
}
