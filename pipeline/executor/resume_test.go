package executor_test

import (
	"context"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// An executor that died after creating an approval but before marking the
// batch awaiting resumes with that approval, even if the policy changed in
// between: the call does not run on the new policy's say-so, and the open
// prompt stays the one that decides it.
func TestAResumedBatchKeepsTheApprovalsItAlreadyCreated(t *testing.T) {
	count := &pt.Counter{}
	// The policy the restarted executor runs under: count needs no approval.
	h := pt.Start(t, pt.Options{Stages: []string{}, Policy: `{
	  "version": "after-change",
	  "tools": {"count": {"approval": "never"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`, Tools: []tools.Tool{count}})
	at := h.Accept(h.Inbound("resume", "alice", pt.Call("count", `{}`)))
	ctx := context.Background()

	// State left by the executor that died: batch running, approval pending.
	n := len(at.Calls)
	b := &schemas.BatchRecord{TurnID: at.TurnID, SessionID: at.Context.SessionID, Context: at.Context, Calls: at.Calls,
		State: schemas.BatchRunning, Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n)}
	if _, err := h.Store.Batches.Create(ctx, at.TurnID, b); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Engine.Acquire(ctx, batch.SessionOf(b.Context), b.TurnID, 0, nil); err != nil {
		t.Fatal(err)
	}
	id := schemas.ApprovalID(at.TurnID, 0)
	c := at.Calls[0]
	rec := &schemas.ApprovalRecord{ApprovalID: id, TurnID: at.TurnID, SessionID: b.SessionID, CallID: c.CallID, Context: at.Context,
		Tool: c.Tool, Args: c.Args, ArgsDigest: c.ArgsDigest, PolicyVersion: "before-change", Options: []string{"approve", "deny"},
		Status: schemas.ApprovalPending}
	if _, err := h.Store.Approvals.Create(ctx, id, rec); err != nil {
		t.Fatal(err)
	}

	if err := h.Executor.Advance(ctx, at.TurnID); err != nil {
		t.Fatal(err)
	}
	got := h.Batch(at.TurnID)
	if got.State != schemas.BatchAwaiting || got.Approvals[0] != id || got.Results[0] != nil {
		t.Fatalf("batch %+v, want awaiting on the existing approval %s", got, id)
	}
	if count.Total() != 0 {
		t.Fatalf("the call ran %d times on the changed policy while its approval was pending", count.Total())
	}
	// The attempt that died never requested it in the turn's log: the
	// resumption's move to awaiting does, so a transport can show it.
	if req := h.LoggedRequests(at.TurnID); len(req) != 1 || req[0].ApprovalID != id || req[0].Status != schemas.ApprovalPending {
		t.Fatalf("the awaiting event requests %+v, want %s", req, id)
	}
	if req := h.Requested(at.TurnID); len(req) != 1 || req[0].ApprovalID != id {
		t.Fatalf("requests %+v, want one for %s", req, id)
	}
}

// A batch an earlier version kept in tollgate_batches keeps no request
// when this version moves it to awaiting (its record stays in the bucket,
// its log empty): its approval is announced on approval.requested, as
// before, so that the readers' published path prompts for it.
func TestABucketedBatchHasItsRequestPublished(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{}})
	at := h.Accept(h.Inbound("bucketed", "alice", pt.Call("write_file", `{"path":"b.txt","content":"x"}`)))
	ctx := context.Background()
	n := len(at.Calls)
	b := &schemas.BatchRecord{TurnID: at.TurnID, SessionID: at.Context.SessionID, Context: at.Context, Calls: at.Calls,
		State: schemas.BatchRunning, Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n)}
	if _, err := h.Store.Batches.Create(ctx, at.TurnID, b); err != nil {
		t.Fatal(err)
	}
	h.MakeBucketed(at.TurnID)
	if _, err := h.Engine.Acquire(ctx, batch.SessionOf(b.Context), b.TurnID, 0, nil); err != nil {
		t.Fatal(err)
	}

	if err := h.Executor.Advance(ctx, at.TurnID); err != nil {
		t.Fatal(err)
	}
	id := schemas.ApprovalID(at.TurnID, 0)
	if got := h.Batch(at.TurnID); got.State != schemas.BatchAwaiting || !got.Bucketed() || got.Approvals[0] != id {
		t.Fatalf("batch %+v, want awaiting on %s, kept in the bucket", got, id)
	}
	if n := len(h.LoggedRequests(at.TurnID)); n != 0 {
		t.Fatalf("%d requests in the turn's log, want none (the batch is the bucket's)", n)
	}
	pub := h.PublishedRequests(at.TurnID)
	if len(pub) != 1 || pub[0].ApprovalID != id || pub[0].Status != schemas.ApprovalPending {
		t.Fatalf("published requests %+v, want the pending %s", pub, id)
	}
}
