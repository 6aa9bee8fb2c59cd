package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

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

// A call an executor claimed before it died may have started: whatever
// the catalog or the policy says when its run is resumed, only the
// claim's rule settles it. Here its tool has left the catalog since (the
// tool's service is down), and, in one case, the policy now denies it: a
// claim within its lease keeps the call waiting, and one past its lease
// is reported EXECUTION_UNCERTAIN, never TOOL_NOT_FOUND or POLICY_DENIED
// (found by make chaos: a call that ran was reported failed
// TOOL_NOT_FOUND). A call without a claim is still refused at once.
func TestAResumedRunReportsAClaimedCallByItsClaimNotByTheCatalog(t *testing.T) {
	const lease = 2 * time.Second
	never := `{"version": "now", "tools": {"gone": {"approval": "never"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}}`
	denies := `{"version": "now", "tools": {"gone": {"approval": "never", "audiences": {"personal": "deny"}}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}}`
	for _, tc := range []struct {
		name    string
		policy  string
		legacy  bool          // the claim a record of tollgate_claims, the batch version 1
		claimed bool          // the call has a claim
		age     time.Duration // how long ago it was claimed
		want    schemas.Code  // "": the call waits (ErrClaimHeld)
	}{
		{name: "a claim past its lease is uncertain", policy: never, claimed: true, age: 2 * lease, want: schemas.CodeExecutionUncertain},
		{name: "a claim past its lease is uncertain though the policy now denies the call", policy: denies, claimed: true, age: 2 * lease, want: schemas.CodeExecutionUncertain},
		{name: "a claim within its lease keeps the call waiting", policy: never, claimed: true},
		{name: "a version 1 claim past its lease is uncertain", policy: never, legacy: true, claimed: true, age: 2 * lease, want: schemas.CodeExecutionUncertain},
		{name: "a version 1 claim within its lease keeps the call waiting", policy: never, legacy: true, claimed: true},
		{name: "a call without a claim is refused", policy: never, want: schemas.CodeToolNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No tool named "gone" in the catalog.
			h := pt.Start(t, pt.Options{Stages: []string{}, Policy: tc.policy, ClaimLease: lease, ToolTimeout: lease / 2})
			at := h.Accept(h.Inbound("claimed", "alice", pt.Call("gone", `{}`), pt.Call("gone", `{"b":2}`)))
			ctx := context.Background()
			n := len(at.Calls)
			b := &schemas.BatchRecord{TurnID: at.TurnID, SessionID: at.Context.SessionID, Context: at.Context, Calls: at.Calls,
				State: schemas.BatchRunning, Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n), UpdatedAt: time.Now().UTC()}
			claimedAt := time.Now().UTC().Add(-tc.age)
			if tc.claimed && !tc.legacy {
				b.SetClaim(0, &schemas.CallClaim{Worker: "executor@dead", ClaimedAt: claimedAt})
			}
			if _, err := h.Store.Batches.Create(ctx, at.TurnID, b); err != nil {
				t.Fatal(err)
			}
			if tc.legacy {
				h.MakeLegacy(at.TurnID)
				if tc.claimed {
					c := at.Calls[0]
					claim := &schemas.ExecutionClaim{CallID: c.CallID, TurnID: at.TurnID, Tool: c.Tool, ArgsDigest: c.ArgsDigest,
						Worker: "executor@dead", ClaimedAt: claimedAt}
					if _, err := h.Store.Claims.Create(ctx, c.CallID, claim); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := h.Engine.Acquire(ctx, batch.SessionOf(b.Context), b.TurnID, 0, nil); err != nil {
				t.Fatal(err)
			}

			err := h.Executor.Advance(ctx, at.TurnID)
			got := h.Batch(at.TurnID)
			if tc.want == "" {
				if !errors.Is(err, batch.ErrClaimHeld) {
					t.Fatalf("Advance: %v, want ErrClaimHeld", err)
				}
				if got.State != schemas.BatchRunning || got.Results[0] != nil {
					t.Fatalf("batch %s, result %+v: want running, the claimed call without a result", got.State, got.Results[0])
				}
				return
			}
			if err != nil {
				t.Fatalf("Advance: %v", err)
			}
			if !got.State.Terminal() {
				t.Fatalf("batch %s, want ended", got.State)
			}
			if r := got.Results[0]; r == nil || r.Code != tc.want {
				t.Fatalf("claimed call's result %+v, want %s", r, tc.want)
			}
			// The call beside it, never claimed, is refused as before.
			if r := got.Results[1]; r == nil || r.Code != schemas.CodeToolNotFound && r.Code != schemas.CodePolicyDenied {
				t.Fatalf("unclaimed call's result %+v, want refused", r)
			}
		})
	}
}
