package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// synth builds the facts of a clean three-turn session: turn A (one plain
// call), turn B (one guarded call, approved), then turn C (one call of the
// remote tool service), each executed once.
func synth() *Facts {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(idx int, seq uint64, calls []CallPlan, end time.Time) TurnFact {
		id := schemas.TurnID(transport, "m-"+string(rune('a'+idx)))
		ctx := &schemas.TurnContext{V: 1, TurnID: id, SessionID: "s1", Requester: schemas.Requester{Principal: "chaos:u1"}, Provenance: schemas.Provenance{StreamSeq: seq}}
		b := &schemas.BatchRecord{TurnID: id, SessionID: "s1", Context: ctx, State: schemas.BatchCompleted, UpdatedAt: end}
		return TurnFact{Plan: TurnPlan{Index: idx, Session: 1, Calls: calls}, ID: id, SessionID: "s1", Principal: "chaos:u1",
			Published: true, Seq: seq, Batch: b, Approvals: make([]*schemas.ApprovalRecord, len(calls))}
	}
	a := mk(0, 1, []CallPlan{{Tool: tools.LedgerTool}}, t0.Add(10*time.Millisecond))
	b := mk(1, 2, []CallPlan{{Tool: tools.LedgerGuardedTool, Decision: DecideApprove}}, t0.Add(40*time.Millisecond))
	b.Approvals[0] = &schemas.ApprovalRecord{ApprovalID: schemas.ApprovalID(b.ID, 0), Status: schemas.ApprovalApproved,
		RequestedAt: t0.Add(20 * time.Millisecond), Decision: &schemas.DecisionInfo{Principal: "chaos:u1", DecidedAt: t0.Add(25 * time.Millisecond)}}
	c := mk(2, 3, []CallPlan{{Tool: toolsvc.Ledger}}, t0.Add(70*time.Millisecond))
	entry := func(t TurnFact, i int, at time.Time) toolsvc.Execution {
		return toolsvc.Execution{LedgerEntry: tools.LedgerEntry{CallID: schemas.CallID(t.ID, i), Tool: t.Plan.Calls[i].Tool, CtxTurnID: t.ID, CtxSessionID: "s1",
			CtxPrincipal: "chaos:u1", CtxStreamSeq: t.Seq, ContextDigest: schemas.ContextDigest(t.Batch.Context), PID: 1, At: at.UnixNano()}}
	}
	// What the tool service journals: no sequence or digest, the view.
	remote := entry(c, 0, t0.Add(60*time.Millisecond))
	remote.CtxStreamSeq, remote.ContextDigest = 0, ""
	view := natstool.View(c.Batch.Context)
	remote.View = &view
	outcome := func(t TurnFact) *schemas.TurnOutcome {
		return &schemas.TurnOutcome{TurnID: t.ID, State: schemas.TurnCompleted, FinishedAt: t.Batch.UpdatedAt,
			Results: []schemas.ToolResult{{CallID: schemas.CallID(t.ID, 0), Status: schemas.ResultOK}}}
	}
	return &Facts{
		Turns:    []TurnFact{a, b, c},
		Ledger:   []toolsvc.Execution{entry(a, 0, t0.Add(5*time.Millisecond)), entry(b, 0, t0.Add(30*time.Millisecond)), remote},
		Outcomes: map[string][]*schemas.TurnOutcome{a.ID: {outcome(a)}, b.ID: {outcome(b)}, c.ID: {outcome(c)}},
	}
}

// Each check finds the violation it is for, and only that one: the checks
// are not vacuous.
func TestCheckFindsEachViolation(t *testing.T) {
	if r := Check(synth()); r.Violations() != 0 {
		var b strings.Builder
		r.Print(&b)
		t.Fatalf("clean facts: %d violations\n%s", r.Violations(), b.String())
	}
	cases := []struct {
		name   string
		break_ func(f *Facts)
		field  func(r *Report) int
	}{
		{"lost: no outcome", func(f *Facts) { delete(f.Outcomes, f.Turns[1].ID) }, func(r *Report) int { return r.Lost }},
		{"lost: batch not terminal", func(f *Facts) { f.Turns[1].Batch.State = schemas.BatchAwaiting }, func(r *Report) int { return r.Lost }},
		{"not sent", func(f *Facts) { f.Turns[1].Published = false; f.Ledger = f.Ledger[:1] }, func(r *Report) int { return r.NotSent }},
		{"duplicate", func(f *Facts) { f.Ledger = append(f.Ledger, f.Ledger[0]) }, func(r *Report) int { return r.DuplicateExecutions }},
		{"denied approval", func(f *Facts) { f.Turns[1].Approvals[0].Status = schemas.ApprovalDenied }, func(r *Report) int { return r.WithoutApproval }},
		{"approved by someone else", func(f *Facts) { f.Turns[1].Approvals[0].Decision.Principal = "chaos:mallory" }, func(r *Report) int { return r.WithoutApproval }},
		{"ran before the decision", func(f *Facts) { f.Turns[1].Approvals[0].Decision.DecidedAt = time.Unix(0, f.Ledger[1].At+1) }, func(r *Report) int { return r.WithoutApproval }},
		{"other turn's context", func(f *Facts) { f.Ledger[1].CtxTurnID = f.Turns[0].ID }, func(r *Report) int { return r.WrongContext }},
		{"other digest", func(f *Facts) { f.Ledger[1].ContextDigest = "x" }, func(r *Report) int { return r.WrongContext }},
		{"unknown call", func(f *Facts) { f.Ledger[1].CallID = "t-nope-0" }, func(r *Report) int { return r.WrongContext }},
		{"ran before the earlier turn ended", func(f *Facts) {
			f.Turns[1].Approvals[0].RequestedAt = f.Turns[0].Batch.UpdatedAt.Add(-time.Millisecond)
		}, func(r *Report) int { return r.SessionOrder }},
		{"ended before the earlier turn", func(f *Facts) {
			f.Turns[0].Batch.UpdatedAt = f.Turns[1].Batch.UpdatedAt.Add(time.Millisecond)
		}, func(r *Report) int { return r.SessionOrder }},
		{"outcome says it did not run", func(f *Facts) { f.Outcomes[f.Turns[0].ID][0].Results[0].Status = schemas.ResultFailed }, func(r *Report) int { return r.Unreported }},
		{"ok without execution", func(f *Facts) { f.Ledger = f.Ledger[1:] }, func(r *Report) int { return r.OKWithoutExecution }},
		{"conflicting outcomes", func(f *Facts) {
			o := *f.Outcomes[f.Turns[0].ID][0]
			o.State = schemas.TurnFailed
			f.Outcomes[f.Turns[0].ID] = append(f.Outcomes[f.Turns[0].ID], &o)
		}, func(r *Report) int { return r.ConflictingOutcomes }},
		{"bad ledger line", func(f *Facts) { f.BadLedger = []string{"{"} }, func(r *Report) int { return r.BadLedgerLines }},
		{"remote call sent twice", func(f *Facts) { f.Ledger = append(f.Ledger, f.Ledger[2]) }, func(r *Report) int { return r.DuplicateExecutions }},
		{"remote call under another view", func(f *Facts) { f.Ledger[2].View.Requester.Principal = "chaos:mallory" }, func(r *Report) int { return r.WrongContext }},
		{"remote call under another audience", func(f *Facts) { f.Ledger[2].View.Audience = "public" }, func(r *Report) int { return r.WrongContext }},
		{"remote call with a lost reply reported ok", func(f *Facts) { f.Ledger[2].Crash = true }, func(r *Report) int { return r.RemoteMisreported }},
		{"remote call reported as a tool error", func(f *Facts) {
			res := &f.Outcomes[f.Turns[2].ID][0].Results[0]
			res.Status, res.Code = schemas.ResultError, schemas.CodeToolFailed
		}, func(r *Report) int { return r.RemoteMisreported }},
		{"remote call reported as needing attention for another reason", func(f *Facts) {
			res := &f.Outcomes[f.Turns[2].ID][0].Results[0]
			res.Status, res.Code = schemas.ResultNeedsAttention, schemas.CodeToolReplyInvalid
		}, func(r *Report) int { return r.RemoteMisreported }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := synth()
			c.break_(f)
			r := Check(f)
			if c.field(r) == 0 {
				var b strings.Builder
				r.Print(&b)
				t.Fatalf("not detected\n%s", b.String())
			}
		})
	}
}

// A remote call whose reply was lost, reported needs_attention
// EXECUTION_UNCERTAIN, is no violation, and is counted as a lost reply.
func TestCheckAcceptsALostReplyReportedUncertain(t *testing.T) {
	f := synth()
	f.Ledger[2].Crash = true
	res := &f.Outcomes[f.Turns[2].ID][0].Results[0]
	res.Status, res.Code = schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain
	r := Check(f)
	if r.Violations() != 0 || r.LostReplies != 1 || r.RemoteExecutions != 1 || r.NeedsAttention != 1 {
		var b strings.Builder
		r.Print(&b)
		t.Fatalf("%d violations, %d lost replies, %d remote executions\n%s", r.Violations(), r.LostReplies, r.RemoteExecutions, b.String())
	}
}
