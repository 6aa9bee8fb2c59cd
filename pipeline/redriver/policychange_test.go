package redriver_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// baseTools are the tools of policy A:
//   - count: the requester and cli:bob (named by the tool's decider rule)
//   - listed: the requester and cli:carol (named in the tool's approvers)
//   - pair: two distinct members of group ops, not the requester
//   - other: the requester alone (built-in rule)
var baseTools = map[string]string{
	"count":  `{"approval": "required", "deciders": {"principals": ["cli:bob"]}}`,
	"listed": `{"approval": "required", "approvers": ["cli:carol"]}`,
	"pair":   `{"approval": "required", "deciders": {"requester": false, "groups": ["ops"], "quorum": 2}}`,
	"other":  `{"approval": "required"}`,
}

var baseOps = []string{"cli:olga", "cli:oscar"}

// changed is a policy: A's tools with overrides ("" removes a tool), group
// ops (nil: A's), and default_approval ("" for required).
type changed struct {
	version         string
	defaultApproval string
	ops             []string
	tools           map[string]string
}

func (c changed) JSON() string {
	ts := maps.Clone(baseTools)
	for k, v := range c.tools {
		if v == "" {
			delete(ts, k)
		} else {
			ts[k] = v
		}
	}
	ops := c.ops
	if ops == nil {
		ops = baseOps
	}
	opsJSON, _ := json.Marshal(ops)
	var entries []string
	for _, k := range slices.Sorted(maps.Keys(ts)) {
		entries = append(entries, fmt.Sprintf("%q: %s", k, ts[k]))
	}
	def := c.defaultApproval
	if def == "" {
		def = "required"
	}
	return fmt.Sprintf(`{
  "version": %q,
  "default_approval": %q,
  "groups": {"ops": %s},
  "tools": {%s},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`, c.version, def, opsJSON, strings.Join(entries, ",\n"))
}

var policyA = changed{version: "A"}.JSON()

// vote is one decision made while policy A was in force.
type vote struct {
	call   int
	option string
	by     string // sender id on cli
	strong bool
}

// want is the expected result of one call after the redrive under B.
type want struct {
	status schemas.ResultStatus
	code   schemas.Code
}

var (
	runs          = want{schemas.ResultOK, ""}
	policyChanged = want{schemas.ResultFailed, schemas.CodePolicyChanged}
	stillDenied   = want{schemas.ResultDenied, schemas.CodeApprovalDenied}
)

func approve(call int, by string) vote {
	return vote{call: call, option: schemas.OptionApprove, by: by}
}

// TestRedriveRechecksTheCurrentPolicyBeforeEachApprovedCall: approvals are
// decided under policy A by a pipeline without a redriver; then a redriver
// under policy B starts on the same server (a deploy with a new policy) and
// picks up the decided events already in the stream through its durable
// consumer. An approved call runs only if B still grants it.
func TestRedriveRechecksTheCurrentPolicyBeforeEachApprovedCall(t *testing.T) {
	tests := []struct {
		name  string
		calls []string // tools called, in order
		votes []vote
		b     changed
		want  []want
		// started: a redriver under A had moved the batch to started and
		// died before running anything.
		started bool
	}{
		{name: "the tool is now denied", calls: []string{"count"}, votes: []vote{approve(0, "alice")},
			b: changed{tools: map[string]string{"count": `{"approval": "deny"}`}}, want: []want{policyChanged}},
		{name: "the tool is now denied for the turn's audience", calls: []string{"count"}, votes: []vote{approve(0, "bob")},
			b:    changed{tools: map[string]string{"count": `{"approval": "required", "audiences": {"personal": "deny"}, "deciders": {"principals": ["cli:bob"]}}`}},
			want: []want{policyChanged}},
		{name: "the tool is no longer listed and the default now denies", calls: []string{"count"}, votes: []vote{approve(0, "alice")},
			b: changed{defaultApproval: "deny", tools: map[string]string{"count": ""}}, want: []want{policyChanged}},
		{name: "the approving principal is no longer named by the tool's rule", calls: []string{"count"}, votes: []vote{approve(0, "bob")},
			b: changed{tools: map[string]string{"count": `{"approval": "required"}`}}, want: []want{policyChanged}},
		{name: "the approving principal is no longer in the tool's approvers", calls: []string{"listed"}, votes: []vote{approve(0, "carol")},
			b: changed{tools: map[string]string{"listed": `{"approval": "required"}`}}, want: []want{policyChanged}},
		{name: "the approving requester is excluded by requester false", calls: []string{"count"}, votes: []vote{approve(0, "alice")},
			b:    changed{tools: map[string]string{"count": `{"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob"]}}`}},
			want: []want{policyChanged}},
		{name: "the approving principal still qualifies through a group", calls: []string{"count"}, votes: []vote{approve(0, "bob")},
			b:    changed{ops: []string{"cli:olga", "cli:oscar", "cli:bob"}, tools: map[string]string{"count": `{"approval": "required", "deciders": {"groups": ["ops"]}}`}},
			want: []want{runs}},
		{name: "strong assurance is now required and the decider was only verified", calls: []string{"count"}, votes: []vote{approve(0, "alice")},
			b:    changed{tools: map[string]string{"count": `{"approval": "required", "deciders": {"principals": ["cli:bob"], "min_assurance": "strong"}}`}},
			want: []want{policyChanged}},
		{name: "strong assurance is now required and the decider had a second factor", calls: []string{"count"},
			votes: []vote{{call: 0, option: schemas.OptionApprove, by: "alice", strong: true}},
			b:     changed{tools: map[string]string{"count": `{"approval": "required", "deciders": {"principals": ["cli:bob"], "min_assurance": "strong"}}`}},
			want:  []want{runs}},
		{name: "the quorum is raised to 2", calls: []string{"count"}, votes: []vote{approve(0, "alice")},
			b:    changed{tools: map[string]string{"count": `{"approval": "required", "deciders": {"principals": ["cli:bob"], "quorum": 2}}`}},
			want: []want{policyChanged}},
		{name: "the quorum is raised from 2 to 3", calls: []string{"pair"}, votes: []vote{approve(0, "olga"), approve(0, "oscar")},
			b:    changed{ops: []string{"cli:olga", "cli:oscar", "cli:otto"}, tools: map[string]string{"pair": `{"approval": "required", "deciders": {"requester": false, "groups": ["ops"], "quorum": 3}}`}},
			want: []want{policyChanged}},
		{name: "one of a quorum's approvers left the group", calls: []string{"pair"}, votes: []vote{approve(0, "olga"), approve(0, "oscar")},
			b: changed{ops: []string{"cli:olga", "cli:otto"}}, want: []want{policyChanged}},
		{name: "one approver left the group and the quorum is lowered to 1", calls: []string{"pair"}, votes: []vote{approve(0, "olga"), approve(0, "oscar")},
			b:    changed{ops: []string{"cli:olga", "cli:otto"}, tools: map[string]string{"pair": `{"approval": "required", "deciders": {"requester": false, "groups": ["ops"]}}`}},
			want: []want{runs}},
		{name: "the tool now needs no approval", calls: []string{"count"}, votes: []vote{approve(0, "bob")},
			b: changed{tools: map[string]string{"count": `{"approval": "never"}`}}, want: []want{runs}},
		{name: "the tool now needs no approval but its approval was denied", calls: []string{"count"},
			votes: []vote{{call: 0, option: schemas.OptionDeny, by: "alice"}},
			b:     changed{tools: map[string]string{"count": `{"approval": "never"}`}}, want: []want{stillDenied}},
		{name: "the policy is unchanged", calls: []string{"count"}, votes: []vote{approve(0, "bob")},
			b: changed{}, want: []want{runs}},
		{name: "only the policy version changed", calls: []string{"count", "pair"}, votes: []vote{approve(0, "alice"), approve(1, "oscar"), approve(1, "olga")},
			b: changed{version: "A-reissued"}, want: []want{runs, runs}},
		{name: "one call of a batch is now denied and its sibling still runs", calls: []string{"count", "other"},
			votes: []vote{approve(0, "alice"), approve(1, "alice")},
			b:     changed{tools: map[string]string{"count": `{"approval": "deny"}`}}, want: []want{policyChanged, runs}},
		{name: "a batch a redriver under A had started is now denied", calls: []string{"count", "other"},
			votes: []vote{approve(0, "bob"), approve(1, "alice")},
			b:     changed{tools: map[string]string{"count": `{"approval": "deny"}`}}, want: []want{policyChanged, runs},
			started: true},
	}
	// One server for every case, one case at a time: each case's turn has
	// a session of its own, its pipeline under A and its redriver under B
	// stop before the next case starts, and the redriver's durable
	// consumer has handled every earlier event (WaitIdle), so a redriver
	// under B finds only its own case's decided events to act on.
	env := jstest.Start(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.b.version == "" {
				tc.b.version = "B"
			}
			policyB := tc.b.JSON()
			counts := map[string]*pt.Counter{}
			var ts []tools.Tool
			for name := range baseTools {
				counts[name] = &pt.Counter{ToolName: name}
				ts = append(ts, counts[name])
			}

			// Under policy A: requested and decided; no redriver runs.
			h := pt.Start(t, pt.Options{Env: env, Policy: policyA, Tools: ts, Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
			var calls []schemas.ProposedCall
			for j, tool := range tc.calls {
				calls = append(calls, pt.Call(tool, fmt.Sprintf(`{"case":%d,"call":%d}`, i, j)))
			}
			turn := h.Send(h.Inbound(fmt.Sprintf("policy-change-%d", i), "alice", calls...))
			for j := range tc.calls {
				if a := h.WaitPending(schemas.ApprovalID(turn, j)); a.PolicyVersion != "A" {
					t.Fatalf("approval requested under %q, want A", a.PolicyVersion)
				}
			}
			for _, v := range tc.votes {
				d := h.Decision(schemas.ApprovalID(turn, v.call), v.option, "cli", v.by)
				d.Decider.Strong = v.strong
				h.WaitConsumed(pt.Approver, h.Submit(d))
			}
			decided := make([]schemas.ApprovalStatus, len(tc.calls))
			for j := range tc.calls {
				a := h.WaitApproval(schemas.ApprovalID(turn, j), "decided", func(a *schemas.ApprovalRecord) bool { return a.Status.Decided() })
				decided[j] = a.Status
			}
			for j := range tc.calls {
				if rej := h.Rejections(schemas.ApprovalID(turn, j)); len(rej) != 0 {
					t.Fatalf("a decision under A was rejected: %+v", rej[0])
				}
			}
			if n := len(h.Decisions(turn)); n != len(tc.calls) {
				t.Fatalf("%d decided events in the stream, want %d", n, len(tc.calls))
			}
			if tc.started {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted })
			}
			h.Stop()
			if b := h.Batch(turn); b.State.Terminal() {
				t.Fatalf("batch %s before any redriver ran", b.State)
			}

			// A redriver under policy B starts on the same server.
			r := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policyB, Tools: ts, Stages: []string{pt.Redriver}})
			b, out := r.WaitTerminal(turn)
			r.WaitIdle(pt.Redriver)
			if b.State != schemas.BatchCompleted || out.State != schemas.TurnCompleted || out.Code != "" {
				t.Fatalf("batch %s, outcome %s %s; want completed (a changed policy fails the call, not the turn)", b.State, out.State, out.Code)
			}
			if len(out.Results) != len(tc.calls) {
				t.Fatalf("outcome has %d results, want %d", len(out.Results), len(tc.calls))
			}
			for j, w := range tc.want {
				res, orig := b.Results[j], out.Results[j]
				id := schemas.ApprovalID(turn, j)
				if res.Status != w.status || res.Code != w.code || res.ApprovalID != id {
					t.Fatalf("call %d (%s): result %+v, want %s %s for %s", j, tc.calls[j], res, w.status, w.code, id)
				}
				if orig.Status != w.status || orig.Code != w.code {
					t.Fatalf("call %d: outcome carries %s %s, want %s %s", j, orig.Status, orig.Code, w.status, w.code)
				}
				if w == policyChanged && !strings.Contains(res.Reason, tc.b.version) {
					t.Fatalf("call %d: reason %q does not name the current policy %s", j, res.Reason, tc.b.version)
				}
				wantRuns := 0
				if w == runs {
					wantRuns = 1
				}
				if n := counts[tc.calls[j]].Runs(schemas.CallID(turn, j)); n != wantRuns {
					t.Fatalf("call %d (%s) ran %d times, want %d", j, tc.calls[j], n, wantRuns)
				}
				// The approval itself is history: the redrive does not rewrite it.
				if a := r.Approval(id); a.Status != decided[j] || a.PolicyVersion != "A" {
					t.Fatalf("approval %s is %s under %s after the redrive, want %s under A", id, a.Status, a.PolicyVersion, decided[j])
				}
			}
			if n := r.Starts(turn); n != 1 {
				t.Fatalf("%d started outcomes, want 1", n)
			}
			if n := len(r.Redrives("failed", turn)); n != 0 {
				t.Fatalf("%d failed redrive outcomes: a changed policy fails the call, not the redrive", n)
			}
			if n := len(r.Outcomes(turn)); n != 1 {
				t.Fatalf("%d outcome events, want 1", n)
			}
			r.Stop()
		})
	}
}

// A redriver under policy A started the batch, claimed the approved call and
// ran it (or died while it ran), then crashed before the batch completed. A
// redriver under policy B, which denies the tool, resumes it. The call is
// not run again, and its result must say what the claim says (it ran, or it
// may have run), never "failed: POLICY_CHANGED", which tells the requester
// the tool did not run.
func TestACallClaimedBeforeThePolicyChangedKeepsWhatItsClaimSays(t *testing.T) {
	policyB := changed{version: "B", tools: map[string]string{"count": `{"approval": "deny"}`}}.JSON()
	ran := func(call schemas.ToolCall, approvalID string) *schemas.ToolResult {
		return &schemas.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: schemas.ResultOK, Output: "ran under A",
			ApprovalID: approvalID, FinishedAt: time.Now().UTC()}
	}
	tests := []struct {
		name   string
		result func(call schemas.ToolCall, approvalID string) *schemas.ToolResult // recorded with the claim; nil: none
		want   want
		legacy bool // a version 1 batch, its claim in tollgate_claims
	}{
		{"the batch holds the result of the run", ran, runs, false},
		{"the claim has no result: the worker died while the tool ran", nil,
			want{schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain}, false},
		{"a version 1 batch's claim holds the result of the run", ran, runs, true},
		{"a version 1 batch's claim has no result: the worker died while the tool ran", nil,
			want{schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain}, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			count := &pt.Counter{}
			h := pt.Start(t, pt.Options{Policy: policyA, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
			turn := h.Send(h.Inbound(fmt.Sprintf("claimed-then-changed-%d", i), "alice", pt.Call("count", `{}`)))
			id := schemas.ApprovalID(turn, 0)
			h.WaitPending(id)
			h.WaitConsumed(pt.Approver, h.Submit(h.Decision(id, schemas.OptionApprove, "cli", "bob")))
			h.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })

			// The crashed redriver's traces: batch started, call claimed.
			call := h.Batch(turn).Calls[0]
			claimedAt := time.Now().UTC().Add(-time.Hour)
			if tc.legacy {
				h.MakeLegacy(turn)
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted })
				claim := &schemas.ExecutionClaim{CallID: call.CallID, TurnID: turn, Tool: call.Tool, ArgsDigest: call.ArgsDigest,
					Worker: "redriver@crashed", ClaimedAt: claimedAt}
				if tc.result != nil {
					claim.Result = tc.result(call, id)
				}
				ctx, cancel := h.Ctx()
				defer cancel()
				if _, err := h.Store.Claims.Create(ctx, call.CallID, claim); err != nil {
					t.Fatal(err)
				}
			} else {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) {
					b.State = schemas.BatchStarted
					b.SetClaim(0, &schemas.CallClaim{Worker: "redriver@crashed", ClaimedAt: claimedAt})
					if tc.result != nil {
						b.Results[0] = tc.result(call, id)
					}
				})
			}
			h.Stop()

			r := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policyB, Tools: []tools.Tool{count}, Stages: []string{pt.Redriver}})
			b, out := r.WaitTerminal(turn)
			if n := count.Total(); n != 0 {
				t.Fatalf("a claimed call ran again (%d times)", n)
			}
			if res := b.Results[0]; res.Status != tc.want.status || res.Code != tc.want.code {
				t.Fatalf("result %s %s (%q), want %s %s: the claim says the tool ran or may have run",
					res.Status, res.Code, res.Reason, tc.want.status, tc.want.code)
			}
			if res := out.Results[0]; res.Status != tc.want.status {
				t.Fatalf("outcome result %s, want %s", res.Status, tc.want.status)
			}
		})
	}
}

// After a deploy that raises a tool's quorum, an approval requested under
// the old policy is decided under the new one. However the approver counts
// the votes, the call never runs on fewer approvals than the current policy
// needs.
func TestAnApprovalDecidedAfterAQuorumRaiseNeverRunsOnOneVote(t *testing.T) {
	policyB := changed{version: "B", tools: map[string]string{"count": `{"approval": "required", "deciders": {"principals": ["cli:bob"], "quorum": 2}}`}}.JSON()
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: policyA, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor}})
	turn := h.Send(h.Inbound("quorum-raised-while-pending", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	if a := h.WaitPending(id); a.Quorum > 1 {
		t.Fatalf("quorum %d under A, want 1", a.Quorum)
	}
	h.Stop()

	r := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policyB, Tools: []tools.Tool{count}, Stages: []string{pt.Approver, pt.Redriver}})
	r.WaitConsumed(pt.Approver, r.Submit(r.Decision(id, schemas.OptionApprove, "cli", "alice")))
	r.WaitIdle(pt.Redriver)
	if n := count.Total(); n != 0 {
		t.Fatalf("the call ran on one approval where the current policy needs two")
	}
	if a := r.Approval(id); a.Status == schemas.ApprovalPending {
		// The approver applied the current quorum: a second approval runs it.
		r.Submit(r.Decision(id, schemas.OptionApprove, "cli", "bob"))
		b, _ := r.WaitTerminal(turn)
		if b.Results[0].Status != schemas.ResultOK || count.Total() != 1 {
			t.Fatalf("result %+v after two approvals, ran %d times", b.Results[0], count.Total())
		}
		return
	}
	// The approver applied the quorum recorded at request time: the
	// redriver must catch it.
	b, _ := r.WaitTerminal(turn)
	if res := b.Results[0]; res.Status != schemas.ResultFailed || res.Code != schemas.CodePolicyChanged {
		t.Fatalf("result %+v, want failed POLICY_CHANGED", res)
	}
	if n := count.Total(); n != 0 {
		t.Fatalf("tool ran %d times", n)
	}
}
