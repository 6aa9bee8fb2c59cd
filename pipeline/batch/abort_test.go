package batch_test

import (
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A batch whose driving message is given up (dead-lettered) must still end
// once, tell its outcome, and hand its session to the next turn.
func TestAbortEndsTheBatchOnceAndFreesItsSession(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	first, next := schemas.TurnID("cli", "abort-1"), schemas.TurnID("cli", "abort-2")
	const session = "abort-session"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	for i, turn := range []string{first, next} {
		var calls []schemas.ToolCall
		state := schemas.BatchQueued
		if i == 0 {
			calls, state = []schemas.ToolCall{call(first, 0, "count", `{}`)}, schemas.BatchRunning
		}
		rec := &schemas.BatchRecord{
			TurnID: turn, SessionID: session, Context: turnContextIn(turn, session), Calls: calls, State: state,
			Approvals: make([]string, len(calls)), Results: make([]*schemas.ToolResult, len(calls)),
		}
		if _, err := f.st.Batches.Create(ctx(t), turn, rec); err != nil {
			t.Fatal(err)
		}
		// first becomes active, next queues behind it.
		if active, err := f.eng.Acquire(ctx(t), sess, turn, 0, nil); err != nil || active != (i == 0) {
			t.Fatalf("acquire %s: %v %v", turn, active, err)
		}
	}

	for range 2 { // idempotent
		if err := f.eng.Abort(ctx(t), first, schemas.CodeRetriesExhausted, "gave up"); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := f.st.Batches.Get(ctx(t), first)
	if err != nil || got.State != schemas.BatchFailed || got.Code != schemas.CodeRetriesExhausted {
		t.Fatalf("batch %+v %v, want failed RETRIES_EXHAUSTED", got, err)
	}
	if r := got.Results[0]; r == nil || r.Status != schemas.ResultFailed || r.Code != schemas.CodeRetriesExhausted {
		t.Fatalf("call result %+v, want failed with the abort code", r)
	}
	if f.count.Total() != 0 {
		t.Fatalf("the tool ran %d times during an abort", f.count.Total())
	}
	outs := h.Outcomes(first)
	if len(outs) != 1 || outs[0].State != schemas.TurnFailed || outs[0].Code != schemas.CodeRetriesExhausted {
		t.Fatalf("outcomes %+v, want one failed outcome", outs)
	}
	s, _, err := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
	if err != nil || s.Active != next || len(s.Queue) != 0 {
		t.Fatalf("session %+v %v, want %s active", s, err, next)
	}
	notices := pt.DecodeAll[schemas.TurnNotice](t, h.Messages(topology.StreamTurns, topology.ReadySubject(schemas.SessionKey("cli", session))))
	if len(notices) != 1 || notices[0].TurnID != next {
		t.Fatalf("ready notices %+v, want one for %s", notices, next)
	}

	// A terminal batch is left as it is; a missing one is nothing to end.
	if err := f.eng.Abort(ctx(t), first, schemas.CodeHandlerPanic, "again"); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := f.st.Batches.Get(ctx(t), first); again.Code != schemas.CodeRetriesExhausted {
		t.Fatalf("a second abort rewrote a terminal batch: %+v", again)
	}
	if err := f.eng.Abort(ctx(t), schemas.TurnID("cli", "never-accepted"), schemas.CodeHandlerPanic, "x"); err != nil {
		t.Fatalf("abort of a missing batch: %v", err)
	}
}

func TestTurnOfFindsTheTurnAMessageNames(t *testing.T) {
	turn := schemas.TurnID("cli", "turn-of")
	enc := func(r schemas.Record) []byte {
		b, err := schemas.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"an accepted turn", enc(&schemas.AcceptedTurn{TurnID: turn, Context: turnContext(turn)}), turn},
		{"a ready notice", enc(&schemas.TurnNotice{TurnID: turn, Kind: schemas.NoticeReady}), turn},
		{"a decided event", enc(&schemas.DecidedEvent{ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, Status: schemas.ApprovalApproved}), turn},
		{"a turn id that is not a key", enc(&schemas.TurnNotice{TurnID: "t x", Kind: schemas.NoticeReady}), ""},
		{"a decision names no turn", enc(&schemas.Decision{DecisionID: "d", ApprovalID: "a-1-0", Transport: "cli", Decider: schemas.Sender{ID: "x", Kind: schemas.SenderUser}, Option: "approve"}), ""},
		{"garbage", []byte{0xc1}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := batch.TurnOf(tc.data); got != tc.want {
				t.Fatalf("TurnOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// Conclude publishes one outcome however many times, and however
// concurrently, it is called for a batch.
func TestConcludePublishesOneOutcome(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	turn := schemas.TurnID("cli", "conclude")
	newBatch(t, f, turn, schemas.BatchStarted, call(turn, 0, "count", `{}`))
	res := f.eng.Result(call(turn, 0, "count", `{}`), schemas.ResultOK, "", "", "")
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := f.eng.Conclude(ctx(t), turn, []*schemas.ToolResult{res}, "", "")
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.eng.Conclude(ctx(t), turn, nil, schemas.CodeHandlerPanic, "late"); err != nil {
		t.Fatal(err)
	}
	outs := h.Outcomes(turn)
	if len(outs) != 1 || outs[0].State != schemas.TurnCompleted || len(outs[0].Results) != 1 {
		t.Fatalf("outcomes %+v, want exactly one completed outcome", outs)
	}
}

// A failed batch leaves no prompt open: its pending approvals become
// abandoned (announced once), and decided ones are left as they are.
func TestAFailedBatchAbandonsItsPendingApprovals(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	turn := schemas.TurnID("cli", "abandon")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"n":1}`)
	b := newBatch(t, f, turn, schemas.BatchAwaiting, c0, c1)
	statuses := []schemas.ApprovalStatus{schemas.ApprovalPending, schemas.ApprovalApproved}
	for i, c := range []schemas.ToolCall{c0, c1} {
		id := schemas.ApprovalID(turn, i)
		rec := &schemas.ApprovalRecord{ApprovalID: id, TurnID: turn, SessionID: b.SessionID, CallID: c.CallID, Context: b.Context,
			Tool: c.Tool, Args: c.Args, ArgsDigest: c.ArgsDigest, Options: []string{"approve", "deny"}, Status: statuses[i]}
		if _, err := f.st.Approvals.Create(ctx(t), id, rec); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// Call 0's approval exists but the batch never recorded it (the
			// executor died before marking the batch awaiting).
			continue
		}
		if _, _, err := f.st.Batches.Mutate(ctx(t), turn, func(r *schemas.BatchRecord) error { r.Approvals[i] = id; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := f.eng.Abort(ctx(t), turn, schemas.CodeTurnContextMismatch, "tampered"); err != nil {
			t.Fatal(err)
		}
	}
	a0, _, _ := f.st.Approvals.Get(ctx(t), schemas.ApprovalID(turn, 0))
	a1, _, _ := f.st.Approvals.Get(ctx(t), schemas.ApprovalID(turn, 1))
	if a0.Status != schemas.ApprovalAbandoned || a0.Decision == nil || a1.Status != schemas.ApprovalApproved {
		t.Fatalf("approvals %s / %s, want abandoned / approved (unchanged)", a0.Status, a1.Status)
	}
	// The abandon is a0's revision, its one decision (a1's is the one it
	// was created with); nothing is published for it, however many
	// aborts ran.
	evs := h.Decisions(turn)
	if len(evs) != 2 || evs[0].ApprovalID != a1.ApprovalID || evs[0].Status != schemas.ApprovalApproved ||
		evs[1].ApprovalID != a0.ApprovalID || evs[1].Status != schemas.ApprovalAbandoned {
		t.Fatalf("decisions %+v, want %s's as created, then %s abandoned, once", evs, a1.ApprovalID, a0.ApprovalID)
	}
	if pub := h.Decided(turn); len(pub) != 0 {
		t.Fatalf("published decided events %+v, want none", pub)
	}
	if f.count.Total() != 0 {
		t.Fatalf("a tool ran %d times", f.count.Total())
	}
}
