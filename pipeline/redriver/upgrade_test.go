package redriver_test

import (
	"errors"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const upgradePolicy = `{
  "version": "upgrade-test",
  "tools": {
    "free":  {"approval": "never"},
    "count": {"approval": "required"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// Batches written by the previous version (version 1 records, their calls'
// claims in tollgate_claims), live at the upgrade in every state, finish
// once on the stages of this version, through the compatibility path: an
// awaiting batch with a pending approval and a queued one behind it in its
// session, a started batch whose claim has no result (its worker died), a
// started one whose claim holds the result, and a running one whose
// executor died before it claimed its call. No call runs twice, and each
// record stays version 1.
func TestVersion1BatchesFinishAfterTheUpgrade(t *testing.T) {
	free, count := &pt.Counter{ToolName: "free"}, &pt.Counter{ToolName: "count"}
	opts := func(stages ...string) pt.Options {
		return pt.Options{Policy: upgradePolicy, Tools: []tools.Tool{free, count}, ClaimLease: 2 * time.Second, ToolTimeout: time.Second, Stages: stages}
	}
	h := pt.Start(t, opts())
	awaiting := h.Send(h.Inbound("up-1", "alice", pt.Call("free", `{"n":1}`), pt.Call("count", `{"n":1}`)))
	h.WaitPending(schemas.ApprovalID(awaiting, 1))
	queued := h.Send(h.Inbound("up-1", "alice", pt.Call("count", `{"n":2}`)))
	h.WaitState(queued, schemas.BatchQueued)
	orphaned := h.Send(h.Inbound("up-3", "alice", pt.Call("count", `{"n":3}`)))
	h.WaitPending(schemas.ApprovalID(orphaned, 0))
	recorded := h.Send(h.Inbound("up-4", "alice", pt.Call("count", `{"n":4}`)))
	h.WaitPending(schemas.ApprovalID(recorded, 0))
	h.WaitIdle(pt.AllStages...)
	h.Stop()

	// The approvals of two batches are decided while no redriver runs, and
	// a turn is accepted that no executor has taken yet.
	h2 := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: upgradePolicy, Tools: []tools.Tool{free, count}, Stages: []string{pt.Ingest, pt.Approver}})
	for _, turn := range []string{orphaned, recorded} {
		id := schemas.ApprovalID(turn, 0)
		h2.Decide(id, schemas.OptionApprove, "alice")
		h2.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	}
	// The turn is published as the previous version's ingest published
	// turns: on the accepted subject, not as an entry of its session's
	// order (no version that places turns kept batches in the bucket).
	at := h2.Accept(h2.Inbound("up-5", "alice", pt.Call("free", `{"n":5}`)))
	running := at.TurnID
	h2.Publish(topology.AcceptedSubject(schemas.SessionKeyOf(at.Context)), topology.AcceptedMsgID(running), at)
	h2.Stop()

	// What the previous version left: version 1 records, claims in
	// tollgate_claims.
	ctx, cancel := h.Ctx()
	defer cancel()
	claim := func(turn string, i int, age time.Duration, res *schemas.ToolResult) {
		t.Helper()
		b := h.Batch(turn)
		c := b.Calls[i]
		rec := &schemas.ExecutionClaim{CallID: c.CallID, TurnID: turn, Tool: c.Tool, ArgsDigest: c.ArgsDigest,
			Worker: "redriver@old:1#00000000", ClaimedAt: time.Now().UTC().Add(-age), Result: res}
		if _, err := h.Store.Claims.Create(ctx, c.CallID, rec); err != nil {
			t.Fatal(err)
		}
	}
	h.MakeLegacy(awaiting)
	claim(awaiting, 0, time.Minute, h.Batch(awaiting).Results[0]) // its free call ran under the previous version
	h.MakeLegacy(queued)
	// The previous version's session record: the awaiting batch holds
	// its session, the queued one waits behind it (this version wrote
	// neither: it placed them in the session's order).
	if _, err := h.Store.Sessions.Create(ctx, schemas.SessionKeyOf(h.Batch(awaiting).Context), &schemas.SessionRecord{SessionID: "up-1",
		Active: awaiting, Queue: []string{queued}, UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	for _, turn := range []string{orphaned, recorded} {
		h.MakeLegacy(turn)
		h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted })
	}
	claim(orphaned, 0, time.Hour, nil) // claimed by a redriver that died with the tool running
	ranBefore := &schemas.ToolResult{CallID: schemas.CallID(recorded, 0), Tool: "count", Status: schemas.ResultOK, Output: "ran before the upgrade",
		ApprovalID: schemas.ApprovalID(recorded, 0), FinishedAt: time.Now().UTC()}
	claim(recorded, 0, time.Hour, ranBefore) // its redriver recorded the result, then died
	now := time.Now().UTC()
	if _, err := h.Store.Batches.Create(ctx, running, schemas.AsLegacyBatch(&schemas.BatchRecord{TurnID: running, SessionID: at.Context.SessionID,
		Context: at.Context, Text: at.Text, Calls: at.Calls, State: schemas.BatchRunning,
		Approvals: make([]string, 1), Results: make([]*schemas.ToolResult, 1), CreatedAt: now, UpdatedAt: now})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.Sessions.Create(ctx, schemas.SessionKeyOf(at.Context), &schemas.SessionRecord{SessionID: at.Context.SessionID, Active: running, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	runsBefore := free.Total() + count.Total()
	ranBeforeUpgrade := free.Runs(schemas.CallID(awaiting, 0))

	// The upgrade: this version's stages start on all of it.
	h3 := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: upgradePolicy, Tools: []tools.Tool{free, count}, ClaimLease: 2 * time.Second, ToolTimeout: time.Second})
	h3.Decide(schemas.ApprovalID(awaiting, 1), schemas.OptionApprove, "alice")
	h3.WaitPending(schemas.ApprovalID(queued, 0))
	h3.Decide(schemas.ApprovalID(queued, 0), schemas.OptionApprove, "alice")
	want := map[string]struct {
		status schemas.ResultStatus
		code   schemas.Code
	}{
		awaiting: {schemas.ResultOK, ""}, queued: {schemas.ResultOK, ""},
		orphaned: {schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain},
		recorded: {schemas.ResultOK, ""}, running: {schemas.ResultOK, ""},
	}
	for turn, w := range want {
		b, out := h3.WaitTerminal(turn)
		last := b.Results[len(b.Results)-1]
		if b.State != schemas.BatchCompleted || last.Status != w.status || last.Code != w.code {
			t.Errorf("turn %s ended %s with %+v, want completed with %s %s", turn, b.State, last, w.status, w.code)
		}
		if n := len(h3.Outcomes(turn)); n != 1 || out == nil {
			t.Errorf("turn %s: %d outcomes, want 1", turn, n)
		}
		if !b.Legacy() || len(b.Claims) != 0 {
			t.Errorf("turn %s written back as version %d with claims %v, want version 1 without", turn, b.V, b.Claims)
		}
	}
	if b := h3.Batch(recorded); b.Results[0].Output != "ran before the upgrade" {
		t.Errorf("a call whose claim held its result: %+v, want that result", b.Results[0])
	}
	h3.WaitIdle(pt.AllStages...)
	for call, n := range map[string]int{
		schemas.CallID(awaiting, 0): 0, schemas.CallID(awaiting, 1): 1, schemas.CallID(queued, 0): 1,
		schemas.CallID(orphaned, 0): 0, schemas.CallID(recorded, 0): 0, schemas.CallID(running, 0): 1,
	} {
		got := free.Runs(call) + count.Runs(call)
		if call == schemas.CallID(awaiting, 0) {
			got -= ranBeforeUpgrade // its run under the previous version
		}
		if got != n {
			t.Errorf("call %s ran %d times after the upgrade, want %d", call, got, n)
		}
	}
	if got := free.Total() + count.Total() - runsBefore; got != 3 {
		t.Errorf("%d runs after the upgrade, want 3", got)
	}
	// The calls that ran after the upgrade were claimed where the previous
	// version would have looked for their claims.
	for _, call := range []string{schemas.CallID(awaiting, 1), schemas.CallID(queued, 0), schemas.CallID(running, 0)} {
		if c, _, err := h3.Store.Claims.Get(ctx, call); err != nil || c.Result == nil {
			t.Errorf("claim record of %s: %+v %v, want one with its result", call, c, err)
		}
	}
	if n := h3.Metric("tollgate_legacy_batch_runs_total", nil); n < 5 {
		t.Errorf("%v runs of version 1 batches counted, want at least 5", n)
	}
}

// Batches written by the version before the turn logs (version 2 records
// kept in tollgate_batches, their claims in the record), live at the
// upgrade, finish once where they are: an awaiting batch with a pending
// approval and a queued one behind it in its session, a started batch
// whose claim has no result (its worker died), a started one whose record
// holds the claimed call's result, and a running one whose call was never
// claimed. A turn accepted after the upgrade in the session of the awaiting
// one waits for it, then runs from its turn's log. Nothing of the earlier
// batches is written to a turn log, and no call runs twice.
func TestBucketedBatchesFinishAfterTheUpgrade(t *testing.T) {
	free, count := &pt.Counter{ToolName: "free"}, &pt.Counter{ToolName: "count"}
	opts := func(env *pt.H, stages ...string) pt.Options {
		o := pt.Options{Policy: upgradePolicy, Tools: []tools.Tool{free, count}, ClaimLease: 2 * time.Second, ToolTimeout: time.Second, Stages: stages}
		if env != nil {
			o.Env, o.Keys = env.Env, env.Keys
		}
		return o
	}
	h := pt.Start(t, opts(nil))
	awaiting := h.Send(h.Inbound("b2-1", "alice", pt.Call("free", `{"n":1}`), pt.Call("count", `{"n":1}`)))
	h.WaitPending(schemas.ApprovalID(awaiting, 1))
	queued := h.Send(h.Inbound("b2-1", "alice", pt.Call("count", `{"n":2}`)))
	h.WaitState(queued, schemas.BatchQueued)
	orphaned := h.Send(h.Inbound("b2-3", "alice", pt.Call("count", `{"n":3}`)))
	h.WaitPending(schemas.ApprovalID(orphaned, 0))
	recorded := h.Send(h.Inbound("b2-4", "alice", pt.Call("count", `{"n":4}`)))
	h.WaitPending(schemas.ApprovalID(recorded, 0))
	unclaimed := h.Send(h.Inbound("b2-5", "alice", pt.Call("count", `{"n":5}`)))
	h.WaitPending(schemas.ApprovalID(unclaimed, 0))
	h.WaitIdle(pt.AllStages...)
	h.Stop()

	// The approvals of three batches are decided while no redriver runs.
	h2 := pt.Start(t, opts(h, pt.Ingest, pt.Approver))
	for _, turn := range []string{orphaned, recorded, unclaimed} {
		id := schemas.ApprovalID(turn, 0)
		h2.Decide(id, schemas.OptionApprove, "alice")
		h2.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	}
	h2.Stop()

	// What the version before the turn logs left: every batch in the
	// bucket, as version 2, the claims in the records.
	for _, turn := range []string{awaiting, queued, orphaned, recorded, unclaimed} {
		h.MakeBucketed(turn)
	}
	// The session record that version kept: the awaiting batch holds its
	// session, the queued one waits behind it.
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := h.Store.Sessions.Create(ctx, schemas.SessionKeyOf(h.Batch(awaiting).Context), &schemas.SessionRecord{SessionID: "b2-1",
		Active: awaiting, Queue: []string{queued}, UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	ranBefore := &schemas.ToolResult{CallID: schemas.CallID(recorded, 0), Tool: "count", Status: schemas.ResultOK, Output: "ran before the upgrade",
		ApprovalID: schemas.ApprovalID(recorded, 0), FinishedAt: time.Now().UTC()}
	h.MutateBatch(orphaned, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchStarted
		b.SetClaim(0, &schemas.CallClaim{Worker: "redriver@old:1#00000000", ClaimedAt: time.Now().UTC().Add(-time.Hour)})
	})
	h.MutateBatch(recorded, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchStarted
		b.SetClaim(0, &schemas.CallClaim{Worker: "redriver@old:1#00000000", ClaimedAt: time.Now().UTC().Add(-time.Hour)})
		b.Results[0] = ranBefore
	})
	h.MutateBatch(unclaimed, func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted })
	runsBefore := free.Total() + count.Total()
	ranBeforeUpgrade := free.Runs(schemas.CallID(awaiting, 0))

	// The upgrade: this version's stages start on all of it.
	h3 := pt.Start(t, opts(h))
	later := h3.Send(h3.Inbound("b2-1", "alice", pt.Call("free", `{"n":6}`)))
	h3.Decide(schemas.ApprovalID(awaiting, 1), schemas.OptionApprove, "alice")
	h3.WaitPending(schemas.ApprovalID(queued, 0))
	if b := h3.Batch(later); b == nil || b.State != schemas.BatchQueued {
		t.Fatalf("a turn accepted behind an earlier version's active batch: %+v, want it queued", b)
	}
	h3.Decide(schemas.ApprovalID(queued, 0), schemas.OptionApprove, "alice")
	want := map[string]struct {
		status schemas.ResultStatus
		code   schemas.Code
	}{
		awaiting: {schemas.ResultOK, ""}, queued: {schemas.ResultOK, ""},
		orphaned: {schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain},
		recorded: {schemas.ResultOK, ""}, unclaimed: {schemas.ResultOK, ""}, later: {schemas.ResultOK, ""},
	}
	ctx, cancel = h3.Ctx()
	defer cancel()
	for turn, w := range want {
		b, out := h3.WaitTerminal(turn)
		last := b.Results[len(b.Results)-1]
		if b.State != schemas.BatchCompleted || last.Status != w.status || last.Code != w.code {
			t.Errorf("turn %s ended %s with %+v, want completed with %s %s", turn, b.State, last, w.status, w.code)
		}
		if n := len(h3.Outcomes(turn)); n != 1 || out == nil {
			t.Errorf("turn %s: %d outcomes, want 1", turn, n)
		}
		_, _, logErr := h3.Store.Batches.Log.Get(ctx, turn)
		switch {
		case turn == later && (b.Bucketed() || logErr != nil):
			t.Errorf("the turn accepted after the upgrade: bucketed %v, log %v; want it in its turn's log", b.Bucketed(), logErr)
		case turn != later && (!b.Bucketed() || b.Legacy() || !errors.Is(logErr, store.ErrNotFound)):
			t.Errorf("turn %s: bucketed %v, version 1 %v, log %v; want it finished in the bucket as version 2, its log empty", turn, b.Bucketed(), b.Legacy(), logErr)
		}
	}
	if b := h3.Batch(recorded); b.Results[0].Output != "ran before the upgrade" {
		t.Errorf("a call whose record held its result: %+v, want that result", b.Results[0])
	}
	if q, l := h3.Batch(queued), h3.Batch(later); !q.UpdatedAt.Before(l.Results[0].FinishedAt) {
		t.Errorf("the later turn's call finished at %v, before the earlier version's queued batch ended at %v", l.Results[0].FinishedAt, q.UpdatedAt)
	}
	h3.WaitIdle(pt.AllStages...)
	for call, n := range map[string]int{
		schemas.CallID(awaiting, 0): 0, schemas.CallID(awaiting, 1): 1, schemas.CallID(queued, 0): 1,
		schemas.CallID(orphaned, 0): 0, schemas.CallID(recorded, 0): 0, schemas.CallID(unclaimed, 0): 1, schemas.CallID(later, 0): 1,
	} {
		got := free.Runs(call) + count.Runs(call)
		if call == schemas.CallID(awaiting, 0) {
			got -= ranBeforeUpgrade // its run before the upgrade
		}
		if got != n {
			t.Errorf("call %s ran %d times after the upgrade, want %d", call, got, n)
		}
	}
	if got := free.Total() + count.Total() - runsBefore; got != 4 {
		t.Errorf("%d runs after the upgrade, want 4", got)
	}
	if n := h3.Metric("tollgate_legacy_batch_runs_total", nil); n != 0 {
		t.Errorf("%v runs of version 1 batches counted, want none", n)
	}
}
