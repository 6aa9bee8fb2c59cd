package chaos

import (
	"slices"
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

// withGrant makes turn B's approval one a session grant decided (no
// prompt): a grant made by the requester in the session 10 ms before.
func withGrant(f *Facts) *schemas.Grant {
	b := &f.Turns[1]
	a := b.Approvals[0]
	g := &schemas.Grant{GrantID: "g-0123456789abcdef0123456789abcdef", Option: GrantOption, Effect: schemas.ApprovalApproved,
		Tool: tools.LedgerGuardedTool, Scope: schemas.GrantScope{Kind: schemas.GrantScopeSession, SessionID: b.SessionID},
		Principal: b.Principal, Context: b.Batch.Context,
		CreatedAt: a.Decision.DecidedAt.Add(-10 * time.Millisecond), ExpiresAt: a.Decision.DecidedAt.Add(time.Hour)}
	a.Decision.Grant = &schemas.GrantUse{GrantID: g.GrantID, Scope: g.Scope}
	f.Grants = map[string]*schemas.Grant{g.GrantID: g}
	return g
}

// A call a live grant of the requester approved is no violation, and is
// counted as decided by a grant.
func TestCheckAcceptsAGrantDecidedApproval(t *testing.T) {
	f := synth()
	withGrant(f)
	r := Check(f)
	if r.Violations() != 0 || r.ApprovalsByGrant != 1 || r.GrantsMade != 1 {
		var b strings.Builder
		r.Print(&b)
		t.Fatalf("%d violations, %d approvals by grant\n%s", r.Violations(), r.ApprovalsByGrant, b.String())
	}
	// Revoked after the call ran: still fine.
	withGrant(f).Revoked = &schemas.GrantRevocation{By: "chaos:harness", At: time.Unix(0, f.Ledger[1].At+1)}
	if r := Check(f); r.Violations() != 0 || r.GrantsRevoked != 1 {
		t.Fatalf("a grant revoked after its call ran: %d violations", r.Violations())
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
		{"grant revoked before the call it approved ran", func(f *Facts) {
			withGrant(f).Revoked = &schemas.GrantRevocation{By: "chaos:harness", At: time.Unix(0, f.Ledger[1].At-1)}
		}, func(r *Report) int { return r.RanAfterGrantEnded }},
		{"grant expired before the call it approved ran", func(f *Facts) {
			withGrant(f).ExpiresAt = time.Unix(0, f.Ledger[1].At-1)
		}, func(r *Report) int { return r.RanAfterGrantEnded }},
		{"approved by a grant that does not exist", func(f *Facts) {
			withGrant(f)
			f.Grants = nil
		}, func(r *Report) int { return r.WithoutApproval }},
		{"approved by a grant of another session", func(f *Facts) { withGrant(f).Scope.SessionID = "s2" }, func(r *Report) int { return r.WithoutApproval }},
		{"approved by a grant someone else made", func(f *Facts) { withGrant(f).Principal = "chaos:mallory" }, func(r *Report) int { return r.WithoutApproval }},
		{"approved by a deny grant", func(f *Facts) { withGrant(f).Effect = schemas.ApprovalDenied }, func(r *Report) int { return r.WithoutApproval }},
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

// synthPlanner is synth with a planner turn P after C in the session: its
// model asked step 0 (one ledger call, run in step batch P-p0 under P's
// context) and step 1 (the final answer), each once before its record was
// made, and its reply published under its outcome's target.
func synthPlanner() *Facts {
	f := synth()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := f.Turns[2]
	p.ID = schemas.TurnID(transport, "m-p")
	p.Seq, p.Plan = 4, TurnPlan{Index: 3, Session: 1, Kind: plannerKind, Steps: [][]CallPlan{{{Tool: tools.LedgerTool}}}}
	ctx := &schemas.TurnContext{V: 1, TurnID: p.ID, SessionID: "s1", Requester: schemas.Requester{Principal: "chaos:u1"}, Provenance: schemas.Provenance{StreamSeq: 4}}
	p.Batch = &schemas.BatchRecord{TurnID: p.ID, SessionID: "s1", Context: ctx, State: schemas.BatchCompleted, UpdatedAt: t0.Add(120 * time.Millisecond)}
	p.Approvals = nil
	stepID := schemas.PlannerStepTurnID(p.ID, 0)
	step := TurnFact{Plan: TurnPlan{Index: 3, Session: 1, Kind: "planner step", Calls: p.Plan.Steps[0]}, ID: stepID, StepOf: p.ID, SessionID: "s1",
		Principal: "chaos:u1", Published: true, Seq: 4, Approvals: make([]*schemas.ApprovalRecord, 1),
		Batch: &schemas.BatchRecord{TurnID: stepID, SessionID: "s1", Context: ctx, State: schemas.BatchCompleted, Origin: p.ID,
			Calls: []schemas.ToolCall{{CallID: schemas.CallID(stepID, 0), Tool: tools.LedgerTool}}, UpdatedAt: t0.Add(100 * time.Millisecond)}}
	f.Turns = append(f.Turns, p)
	f.Steps = []TurnFact{step}
	f.Ledger = append(f.Ledger, toolsvc.Execution{LedgerEntry: tools.LedgerEntry{CallID: schemas.CallID(stepID, 0), Tool: tools.LedgerTool, CtxTurnID: p.ID,
		CtxSessionID: "s1", CtxPrincipal: "chaos:u1", CtxStreamSeq: 4, ContextDigest: schemas.ContextDigest(ctx), PID: 1, At: t0.Add(90 * time.Millisecond).UnixNano()}})
	target := schemas.ReplyTarget{Transport: transport, Channel: schemas.Channel{ID: "dm-u1", Kind: schemas.ChannelDM}}
	f.Outcomes[stepID] = []*schemas.TurnOutcome{{TurnID: stepID, State: schemas.TurnCompleted, Reply: target, Audience: schemas.AudiencePersonal,
		Results: []schemas.ToolResult{{CallID: schemas.CallID(stepID, 0), Status: schemas.ResultOK}}}}
	f.Outcomes[p.ID] = []*schemas.TurnOutcome{{TurnID: p.ID, State: schemas.TurnCompleted, Reply: target, Audience: schemas.AudiencePersonal}}
	f.Planner = &PlannerFacts{
		Turns: map[string]*schemas.PlannerTurn{p.ID: {TurnID: p.ID, State: schemas.PlannerCompleted}},
		Steps: map[string][]*schemas.PlannerStep{p.ID: {
			{TurnID: p.ID, Index: 0, Calls: []schemas.PlannerCall{{Tool: tools.LedgerTool}}, Batch: stepID, CreatedAt: t0.Add(80 * time.Millisecond)},
			{TurnID: p.ID, Index: 1, Text: p.Plan.ReplyText(), CreatedAt: t0.Add(110 * time.Millisecond)}}},
		Replies:  map[string][]*schemas.ReplyEvent{p.ID: {{TurnID: p.ID, SessionID: "s1", Text: p.Plan.ReplyText(), Reply: target, Audience: schemas.AudiencePersonal}}},
		Requests: []ModelRequest{{TurnID: p.ID, Step: 0, At: t0.Add(79 * time.Millisecond), Status: 200}, {TurnID: p.ID, Step: 1, At: t0.Add(109 * time.Millisecond), Status: 200}},
	}
	return f
}

// Each planner check finds the violation it is for, in a planner turn or
// its step batch.
func TestCheckFindsEachPlannerViolation(t *testing.T) {
	if r := Check(synthPlanner()); r.Violations() != 0 || r.StepBatches != 1 || r.Replies != 1 || r.PlannerStates["completed"] != 1 {
		var b strings.Builder
		r.Print(&b)
		t.Fatalf("clean planner facts: %d violations, %d step batches, %d replies\n%s", r.Violations(), r.StepBatches, r.Replies, b.String())
	}
	p := func(f *Facts) *TurnFact { return &f.Turns[3] }
	cases := []struct {
		name   string
		break_ func(f *Facts)
		field  func(r *Report) int
	}{
		{"model step asked again after its answer was recorded", func(f *Facts) {
			f.Planner.Requests = append(f.Planner.Requests, ModelRequest{TurnID: p(f).ID, Step: 0, At: f.Planner.Steps[p(f).ID][0].CreatedAt.Add(modelGrace + time.Millisecond), Status: 200})
		}, func(r *Report) int { return r.DuplicateModelSteps }},
		{"step batch lost: no outcome", func(f *Facts) { delete(f.Outcomes, f.Steps[0].ID) }, func(r *Report) int { return r.Lost }},
		{"step batch not its recorded step's calls", func(f *Facts) { f.Steps[0].Batch.Calls[0].Tool = tools.LedgerGuardedTool },
			func(r *Report) int { return r.StepBatchMismatch }},
		{"step call under the step batch's own id as context", func(f *Facts) { f.Ledger[3].CtxTurnID = f.Steps[0].ID }, func(r *Report) int { return r.WrongContext }},
		{"step call ran before the session's earlier turn ended", func(f *Facts) {
			f.Ledger[3].At = f.Turns[2].Batch.UpdatedAt.Add(-time.Millisecond).UnixNano()
		}, func(r *Report) int { return r.SessionOrder }},
		{"completed without a reply", func(f *Facts) { delete(f.Planner.Replies, p(f).ID) }, func(r *Report) int { return r.WrongReplies }},
		{"reply to another target", func(f *Facts) { f.Planner.Replies[p(f).ID][0].Reply.Channel.ID = "general" }, func(r *Report) int { return r.WrongReplies }},
		{"reply with a wider audience", func(f *Facts) { f.Planner.Replies[p(f).ID][0].Audience = schemas.AudiencePublic }, func(r *Report) int { return r.WrongReplies }},
		{"reply for a turn that is no planner turn", func(f *Facts) {
			f.Planner.Replies[f.Turns[0].ID] = []*schemas.ReplyEvent{{TurnID: f.Turns[0].ID, SessionID: "s1"}}
		}, func(r *Report) int { return r.WrongReplies }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := synthPlanner()
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

// A model step asked again before its answer was recorded (a planner
// killed between the model's answer and the step record) is no
// violation: it is counted as a repeated request.
func TestCheckAcceptsAModelStepRepeatedBeforeItsRecord(t *testing.T) {
	f := synthPlanner()
	id := f.Turns[3].ID
	f.Planner.Requests = append(f.Planner.Requests, ModelRequest{TurnID: id, Step: 0, At: f.Planner.Steps[id][0].CreatedAt.Add(-time.Millisecond), Status: 200})
	if r := Check(f); r.Violations() != 0 || r.RepeatedModelRequests != 1 {
		var b strings.Builder
		r.Print(&b)
		t.Fatalf("%d violations, %d repeated model requests\n%s", r.Violations(), r.RepeatedModelRequests, b.String())
	}
}

// A step batch leaves out the calls the planner refused (a tool the
// catalog lacked while the tool service was down) and numbers the rest
// from 0: the harness maps each batch call to the planned call its
// arguments name, never by position (seed 639371245 had call 1's ledger
// checked as call 0's guarded one).
func TestStepBatchCallsFollowTheRecordedStep(t *testing.T) {
	plan := TurnPlan{Index: 7, Kind: plannerKind, Steps: [][]CallPlan{
		{{Tool: toolsvc.LedgerGuarded, Decision: DecideApprove}, {Tool: toolsvc.Ledger}, {Tool: tools.LedgerGuardedTool, Decision: DecideDeny}},
	}}
	planned := plan.Steps[0]
	refusedFirst := &schemas.PlannerStep{Batch: "b", Calls: []schemas.PlannerCall{
		{Args: plan.StepArgs(0, 0), BatchIndex: -1, Code: schemas.CodeToolNotFound},
		{Args: `{"call":101,"turn":7}`, BatchIndex: 0},
		{Args: plan.StepArgs(0, 2), BatchIndex: 1},
	}}
	tests := []struct {
		name   string
		rec    *schemas.PlannerStep
		want   []CallPlan
		wantOK bool
	}{
		{"no record is checked as the plan", nil, planned, true},
		{"a refused call shifts the others", refusedFirst, []CallPlan{planned[1], planned[2]}, true},
		{"every call refused makes no batch", &schemas.PlannerStep{Calls: []schemas.PlannerCall{{Args: plan.StepArgs(0, 0), BatchIndex: -1}}}, nil, false},
		{"arguments of another turn fall back to the plan", &schemas.PlannerStep{Batch: "b", Calls: []schemas.PlannerCall{{Args: `{"turn":8,"call":100}`, BatchIndex: 0}}}, planned, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := stepBatchCalls(plan, 0, planned, tt.rec)
			if ok != tt.wantOK || !slices.Equal(got, tt.want) {
				t.Fatalf("stepBatchCalls = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}

	rec := &schemas.ApprovalRecord{TurnID: schemas.PlannerStepTurnID("t-x", 0), CallID: schemas.CallID(schemas.PlannerStepTurnID("t-x", 0), 1), Args: plan.StepArgs(0, 2)}
	rec.ApprovalID = schemas.ApprovalID(rec.TurnID, 1)
	if i, err := planCall(plan, planned, rec); err != nil || i != 2 {
		t.Fatalf("planCall of batch call 1 with call 2's arguments = %d, %v; want 2", i, err)
	}
	rec.Args = `{"turn":7,"call":205}`
	if _, err := planCall(plan, planned, rec); err == nil {
		t.Fatal("planCall accepted arguments that name no call of the step")
	}
}
