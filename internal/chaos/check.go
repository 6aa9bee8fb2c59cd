package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// Facts is everything a run's verdict is computed from, gathered after the
// workers have stopped.
type Facts struct {
	Turns       []TurnFact
	Ledger      []toolsvc.Execution               // in-process and remote
	BadLedger   []string                          // lines that do not decode
	Outcomes    map[string][]*schemas.TurnOutcome // every stored outcome, by turn id (outcomes.Stored: logged and published)
	DeadLetters uint64
	Rejections  map[schemas.Code]int
	ProcessLogs []string // problems found in process logs (panic, data race)
	// Planner mode: the step batches of the planner turns (one TurnFact
	// each, StepOf set), and the planner's records and model requests.
	Steps   []TurnFact
	Planner *PlannerFacts
	// Grants are the grant records in KV at the end, by id.
	Grants map[string]*schemas.Grant
}

// TurnFact is one planned turn and what Tollgate stored for it.
type TurnFact struct {
	Plan      TurnPlan
	ID        string
	SessionID string
	Principal string
	Published bool
	Seq       uint64                    // arrival order: TOLLGATE_INBOUND sequence
	Batch     *schemas.BatchRecord      // nil: none
	Approvals []*schemas.ApprovalRecord // per call index; nil: none
	// StepOf is the planner turn whose step batch this is (its calls run
	// under that turn's TurnContext); "" for a turn.
	StepOf string
}

// contextTurn is the turn whose TurnContext t's calls run under.
func (t *TurnFact) contextTurn() string {
	if t.StepOf != "" {
		return t.StepOf
	}
	return t.ID
}

// Report is a run's figures. Violations() > 0 fails the run.
type Report struct {
	Params string
	Replay string

	Planned, Published, Accepted, Terminal, Lost, NotSent int

	Executions          int // ledger lines
	RemoteExecutions    int // ledger lines of the remote tool service
	LostReplies         int // remote executions whose reply the service never sent (crash calls)
	DuplicateExecutions int // executions beyond the first of a call
	WithoutApproval     int // executions of calls whose approval was not approved by the requester (or that policy denies)
	WrongContext        int // executions under a TurnContext other than their turn's (or of a call no turn made)
	SessionOrder        int // turns that ran before an earlier turn of their session had ended
	Unreported          int // executions whose outcome says the call did not run
	OKWithoutExecution  int // ok results with no execution in the ledger
	RemoteMisreported   int // remote calls that ran, reported other than ok or needs_attention EXECUTION_UNCERTAIN (a lost reply: only the latter)
	ConflictingOutcomes int // turns with outcome messages that disagree
	ExpiryNotEnforced   int // decisions sent after expiry that were applied
	BadLedgerLines      int
	ProcessProblems     int // panics or data races in process logs
	// Planner mode.
	DuplicateModelSteps int // model requests for a step whose answer was recorded (more than modelGrace before)
	StepBatchMismatch   int // step batches whose calls are not their recorded step's
	WrongReplies        int // completed planner turns without a reply event, replies of other turns, replies not under the turn's context
	RanAfterGrantEnded  int // executions of calls a grant approved that ran after the grant was revoked or expired

	// WriteKills are the write kills (Config.WriteKills) and what each did.
	WriteKills []WriteKill

	// Standing grants (not violations).
	GrantsMade, GrantsRevoked int // grant records, and those revoked
	ApprovalsByGrant          int // approvals a grant decided (no prompt)
	GrantFailures             int // calls that failed at redrive with GRANT_REVOKED, GRANT_EXPIRED or GRANT_INVALID

	PlannerStates         map[string]int // planner turn records' states (failed:<code>)
	StepBatches           int            // step batches checked like turns
	ModelRequests         int
	RepeatedModelRequests int // answered requests of a step beyond its first, before its record (not a violation)
	Replies               int // reply events of planner turns

	RepeatedOutcomes int // identical outcome messages stored more than once (not a violation)
	NeedsAttention   int
	UncertainNotRun  int // needs_attention results of calls the ledger shows never ran
	DeadLetters      uint64

	States      map[string]int // terminal batch states (failed:<code>)
	Results     map[string]int // result statuses
	ApprovalsBy map[string]int // approval statuses
	Rejections  map[string]int // rejected decisions by code

	Kills, BrokerRestarts, UnexpectedExits int
	// LeaderPauses: nodes stopped (SIGSTOP) while leading the busiest
	// stream, for longer than an election, then continued.
	LeaderPauses int
	// Partitions: nodes cut off from their peers while leading the
	// busiest stream, for longer than an election, then healed.
	Partitions             int
	KillsOf                map[string]int // worker kills by binary
	ToolCrashes            int            // tool service replicas that exited after a crash call
	ClusterNodes           int            // nats-server processes; in a cluster a broker restart kills the TOLLGATE_TURNS leader
	FaultsSkipped          int
	LastFault, AllTerminal time.Time
	Wall                   time.Duration

	Examples map[string][]string // up to 10 per kind of violation
	Notes    map[string][]string // up to 10 per kind of remark (not violations)
}

// violation is one row of the verdict.
type violation struct {
	label string
	n     int
}

func (r *Report) violations() []violation {
	return []violation{
		{"lost turns", r.Lost},
		{"turns never sent (drive stalled)", r.NotSent},
		{"duplicate executions", r.DuplicateExecutions},
		{"executions without an approval", r.WithoutApproval},
		{"executions under another context", r.WrongContext},
		{"session-order violations", r.SessionOrder},
		{"executions the outcome denies", r.Unreported},
		{"ok results without an execution", r.OKWithoutExecution},
		{"remote executions misreported", r.RemoteMisreported},
		{"conflicting outcomes", r.ConflictingOutcomes},
		{"late decisions applied after expiry", r.ExpiryNotEnforced},
		{"undecodable ledger lines", r.BadLedgerLines},
		{"process panics / data races", r.ProcessProblems},
		{"duplicate model steps", r.DuplicateModelSteps},
		{"step batches unlike their step", r.StepBatchMismatch},
		{"replies missing or misaddressed", r.WrongReplies},
		{"executions after their grant ended", r.RanAfterGrantEnded},
	}
}

// Violations is the number of safety violations found.
func (r *Report) Violations() int {
	n := 0
	for _, v := range r.violations() {
		n += v.n
	}
	return n
}

func (r *Report) example(kind, format string, args ...any) {
	if r.Examples == nil {
		r.Examples = map[string][]string{}
	}
	if len(r.Examples[kind]) < 10 {
		r.Examples[kind] = append(r.Examples[kind], fmt.Sprintf(format, args...))
	}
}

func (r *Report) note(kind, format string, args ...any) {
	if r.Notes == nil {
		r.Notes = map[string][]string{}
	}
	if len(r.Notes[kind]) < 10 {
		r.Notes[kind] = append(r.Notes[kind], fmt.Sprintf(format, args...))
	}
}

// Check computes the report of f.
func Check(f *Facts) *Report {
	r := &Report{States: map[string]int{}, Results: map[string]int{}, ApprovalsBy: map[string]int{}, Rejections: map[string]int{}}
	r.DeadLetters = f.DeadLetters
	for c, n := range f.Rejections {
		r.Rejections[string(c)] = n
	}
	r.BadLedgerLines = len(f.BadLedger)
	for _, l := range f.BadLedger {
		r.example("bad ledger line", "%q", l)
	}
	r.ProcessProblems = len(f.ProcessLogs)
	for _, p := range f.ProcessLogs {
		r.example("process problem", "%s", p)
	}

	byID := map[string]*TurnFact{}
	stepsOf := map[string][]*TurnFact{}
	for i := range f.Turns {
		byID[f.Turns[i].ID] = &f.Turns[i]
	}
	for i := range f.Steps {
		s := &f.Steps[i]
		byID[s.ID] = s
		stepsOf[s.StepOf] = append(stepsOf[s.StepOf], s)
	}
	// Executions by call id.
	execs := map[string][]toolsvc.Execution{}
	for _, e := range f.Ledger {
		execs[e.CallID] = append(execs[e.CallID], e)
		if e.Remote() {
			r.RemoteExecutions++
		}
		if e.Crash {
			r.LostReplies++
		}
	}
	r.Executions = len(f.Ledger)
	for _, g := range f.Grants {
		r.GrantsMade++
		if g.Revoked != nil {
			r.GrantsRevoked++
		}
	}

	r.Planned = len(f.Turns)
	for i := range f.Turns {
		t := &f.Turns[i]
		if !t.Published {
			r.NotSent++
			continue
		}
		r.Published++
		if t.Batch != nil {
			r.Accepted++
		}
		if checkEnded(r, t, f.Outcomes[t.ID], execs) {
			r.Terminal++
		}
	}
	// A planner turn's step batches: each ended, with its outcome, like a
	// turn's batch.
	for i := range f.Steps {
		r.StepBatches++
		checkEnded(r, &f.Steps[i], f.Outcomes[f.Steps[i].ID], execs)
	}

	// Every execution: once, of a known call, under its own turn's context,
	// with the approval its call needed.
	for callID, es := range execs {
		if len(es) > 1 {
			r.DuplicateExecutions += len(es) - 1
			pids := []int{}
			for _, e := range es {
				pids = append(pids, e.PID)
			}
			r.example("duplicate execution", "call %s ran %d times (pids %v)", callID, len(es), pids)
		}
		cut := strings.LastIndexByte(callID, '-')
		t := byID[callID[:max(cut, 0)]]
		idx, err := callIndex(callID)
		if t == nil || err != nil || idx >= len(t.Plan.Calls) {
			r.WrongContext += len(es)
			r.example("wrong context", "call %s belongs to no planned turn", callID)
			continue
		}
		for _, e := range es {
			checkExecution(r, t, idx, e, f.Grants)
		}
	}
	checkSessionOrder(r, f, execs, stepsOf)
	checkPlanner(r, f, byID)
	return r
}

// checkEnded checks that the batch of t (a turn, or a planner turn's step
// batch) ended, with outs its outcome messages, and compares its outcome
// with the ledger; it reports whether t ended (else it is lost).
func checkEnded(r *Report, t *TurnFact, outs []*schemas.TurnOutcome, execs map[string][]toolsvc.Execution) bool {
	if t.Batch == nil || !t.Batch.State.Terminal() || len(outs) == 0 {
		r.Lost++
		state := "no batch"
		if t.Batch != nil {
			state = string(t.Batch.State)
		}
		r.example("lost turn", "turn %s (plan %d, %s, session %s): batch %s, %d outcome messages", t.ID, t.Plan.Index, t.Plan.Kind, t.SessionID, state, len(outs))
		return false
	}
	state := string(t.Batch.State)
	if t.Batch.Code != "" {
		state += ":" + string(t.Batch.Code)
	}
	if t.StepOf == "" {
		r.States[state]++
	}
	for _, o := range outs[1:] {
		if !sameOutcome(outs[0], o) {
			r.ConflictingOutcomes++
			r.example("conflicting outcomes", "turn %s: %s/%s vs %s/%s", t.ID, outs[0].State, outs[0].Code, o.State, o.Code)
			break
		}
	}
	r.RepeatedOutcomes += len(outs) - 1
	checkTurn(r, t, outs[0], execs)
	return true
}

func sameOutcome(a, b *schemas.TurnOutcome) bool {
	if a.State != b.State || a.Code != b.Code || len(a.Results) != len(b.Results) {
		return false
	}
	for i := range a.Results {
		if a.Results[i].CallID != b.Results[i].CallID || a.Results[i].Status != b.Results[i].Status {
			return false
		}
	}
	return true
}

// checkTurn compares a terminal turn's outcome with the ledger.
func checkTurn(r *Report, t *TurnFact, o *schemas.TurnOutcome, execs map[string][]toolsvc.Execution) {
	results := map[string]schemas.ToolResult{}
	for _, res := range o.Results {
		results[res.CallID] = res
	}
	for i, c := range t.Plan.Calls {
		callID := schemas.CallID(t.ID, i)
		res, ok := results[callID]
		status := "missing"
		if ok {
			status = string(res.Status)
		}
		r.Results[status]++
		switch res.Code {
		case schemas.CodeGrantRevoked, schemas.CodeGrantExpired, schemas.CodeGrantInvalid:
			r.GrantFailures++
		}
		if res.Status == schemas.ResultNeedsAttention {
			r.NeedsAttention++
			if len(execs[callID]) == 0 {
				r.UncertainNotRun++
			}
			r.note("needs_attention", "call %s (%s; in the ledger %d times): %s", callID, res.Code, len(execs[callID]), res.Reason)
		}
		ran := len(execs[callID]) > 0
		switch {
		case res.Status == schemas.ResultOK && !ran:
			r.OKWithoutExecution++
			r.example("ok without execution", "call %s (%s): result ok, no ledger line", callID, c.Tool)
		case ran && res.Status != schemas.ResultOK && res.Status != schemas.ResultError && res.Status != schemas.ResultNeedsAttention:
			r.Unreported++
			r.example("unreported execution", "call %s (%s) ran but its outcome says %s (%s: %s)", callID, c.Tool, status, res.Code, res.Reason)
		case ran && c.Remote():
			checkRemote(r, callID, c, res, execs[callID])
		}
		if a := approvalOf(t, i); a != nil {
			r.ApprovalsBy[string(a.Status)]++
			if a.Decision != nil && a.Decision.Grant != nil {
				r.ApprovalsByGrant++
			}
			if c.Decision == DecideLate && a.Status == schemas.ApprovalApproved {
				r.ExpiryNotEnforced++
				r.example("expiry not enforced", "approval %s expired at %s but was approved at %s", a.ApprovalID, a.ExpiresAt.Format(time.RFC3339Nano), decidedAt(a))
			}
		}
	}
}

// checkRemote checks the result of a remote call that ran: ok, or
// needs_attention EXECUTION_UNCERTAIN (the reply was lost: a worker or a
// tool service replica died, or the request timed out); only the latter if
// the service journaled it without replying (a crash call).
func checkRemote(r *Report, callID string, c CallPlan, res schemas.ToolResult, es []toolsvc.Execution) {
	uncertain := res.Status == schemas.ResultNeedsAttention && res.Code == schemas.CodeExecutionUncertain
	lost := slices.ContainsFunc(es, func(e toolsvc.Execution) bool { return e.Crash })
	if uncertain || (res.Status == schemas.ResultOK && !lost) {
		return
	}
	r.RemoteMisreported++
	what := "ran"
	if lost {
		what = "ran and its reply was never sent"
	}
	r.example("remote execution misreported", "call %s (%s) %s, but its result is %s (%s: %s)", callID, c.Tool, what, res.Status, res.Code, res.Reason)
}

func approvalOf(t *TurnFact, i int) *schemas.ApprovalRecord {
	if i < len(t.Approvals) {
		return t.Approvals[i]
	}
	return nil
}

func decidedAt(a *schemas.ApprovalRecord) string {
	if a.Decision == nil {
		return "?"
	}
	return a.Decision.DecidedAt.Format(time.RFC3339Nano)
}

// checkExecution checks one ledger line of call idx of t. A remote line
// has no stream sequence or digest: the view the tool service received
// must be the view of the batch's sealed TurnContext. A call a standing
// grant approved (its approval's decision names the grant) counts as
// approved when that grant, among grants, is an approve grant of the
// call's tool made by the requester (on their own turn, in the call's
// session) before the decision; it must not have been revoked or have
// expired before the call ran (the harness revokes only while the
// session's batch waits for its decision, so no redrive's re-check can
// be under way then: docs/security.md's revocation race cannot occur).
func checkExecution(r *Report, t *TurnFact, idx int, e toolsvc.Execution, grants map[string]*schemas.Grant) {
	c := t.Plan.Calls[idx]
	var wrong []string
	if e.Tool != c.Tool {
		wrong = append(wrong, fmt.Sprintf("tool %s, call is %s", e.Tool, c.Tool))
	}
	if e.CtxTurnID != t.contextTurn() {
		wrong = append(wrong, "context of turn "+e.CtxTurnID)
	}
	if e.CtxSessionID != t.SessionID {
		wrong = append(wrong, "context of session "+e.CtxSessionID)
	}
	if e.CtxPrincipal != t.Principal {
		wrong = append(wrong, "requester "+e.CtxPrincipal)
	}
	switch {
	case e.Remote():
		if t.Batch != nil && *e.View != natstool.View(t.Batch.Context) {
			wrong = append(wrong, fmt.Sprintf("view %+v differs from the batch's", *e.View))
		}
	default:
		if e.CtxStreamSeq != t.Seq {
			wrong = append(wrong, fmt.Sprintf("inbound seq %d, turn arrived at %d", e.CtxStreamSeq, t.Seq))
		}
		if t.Batch != nil && e.ContextDigest != schemas.ContextDigest(t.Batch.Context) {
			wrong = append(wrong, "context digest differs from the batch's")
		}
	}
	if len(wrong) > 0 {
		r.WrongContext++
		r.example("wrong context", "call %s (pid %d): %s", e.CallID, e.PID, strings.Join(wrong, "; "))
	}
	switch {
	case c.Tool == tools.LedgerDeniedTool:
		r.WithoutApproval++
		r.example("without approval", "call %s of %s, which policy denies, ran (pid %d)", e.CallID, c.Tool, e.PID)
	case c.NeedsApproval():
		a := approvalOf(t, idx)
		switch {
		case a == nil:
			r.WithoutApproval++
			r.example("without approval", "call %s (%s) ran with no approval record (pid %d)", e.CallID, c.Tool, e.PID)
		case a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.Principal != t.Principal:
			r.WithoutApproval++
			who := ""
			if a.Decision != nil {
				who = a.Decision.Principal
			}
			r.example("without approval", "call %s (%s) ran (pid %d) but approval %s is %s by %q", e.CallID, c.Tool, e.PID, a.ApprovalID, a.Status, who)
		case a.Decision.DecidedAt.After(time.Unix(0, e.At)):
			r.WithoutApproval++
			r.example("without approval", "call %s ran at %s, before its approval was decided at %s", e.CallID, time.Unix(0, e.At).UTC().Format(time.RFC3339Nano), decidedAt(a))
		case a.Decision.Grant != nil:
			checkGrantUse(r, t, c, a, e, grants[a.Decision.Grant.GrantID])
		}
	}
}

// checkGrantUse checks execution e of call c of t, approved by the grant
// g that approval a names (nil: no such record).
func checkGrantUse(r *Report, t *TurnFact, c CallPlan, a *schemas.ApprovalRecord, e toolsvc.Execution, g *schemas.Grant) {
	use := a.Decision.Grant.GrantID
	ran := time.Unix(0, e.At)
	var bad string
	switch {
	case g == nil:
		bad = "which does not exist"
	case g.Effect != schemas.ApprovalApproved || g.Tool != c.Tool || g.Principal != t.Principal:
		bad = fmt.Sprintf("a %s grant of %s by %s", g.Effect, g.Tool, g.Principal)
	case g.Context == nil || g.Context.Requester.Principal != t.Principal || g.Scope.Kind != schemas.GrantScopeSession || g.Scope.SessionID != t.SessionID:
		bad = "made on another requester's turn or for another session"
	case g.CreatedAt.After(a.Decision.DecidedAt):
		bad = "made after the approval was decided at " + decidedAt(a)
	}
	if bad != "" {
		r.WithoutApproval++
		r.example("without approval", "call %s (%s) ran (pid %d), approved by grant %s, %s", e.CallID, c.Tool, e.PID, use, bad)
		return
	}
	switch {
	case g.Revoked != nil && g.Revoked.At.Before(ran):
		r.RanAfterGrantEnded++
		r.example("ran after its grant ended", "call %s ran at %s, approved by grant %s, which %s revoked at %s", e.CallID, stamp(ran), use, g.Revoked.By, stamp(g.Revoked.At))
	case g.ExpiresAt.Before(ran):
		r.RanAfterGrantEnded++
		r.example("ran after its grant ended", "call %s ran at %s, approved by grant %s, which expired at %s", e.CallID, stamp(ran), use, stamp(g.ExpiresAt))
	}
}

// checkSessionOrder: a session runs one batch at a time, in arrival order.
// In arrival order (inbound stream sequence), a turn must not show any sign
// of running (an execution, an approval request) before every earlier turn
// of its session has ended, and must not end before them. Batch end times
// (outcome finished_at), approval requested_at and ledger times all come
// from the wall clock of processes on this machine; a later turn can only
// start after the earlier one's release, which follows its end.
//
// A planner turn's step batches run inside its loop, under its context: the
// turn's first sign is the earliest of its step batches', and its end is
// its own batch record's (made terminal when the loop ends).
func checkSessionOrder(r *Report, f *Facts, execs map[string][]toolsvc.Execution, stepsOf map[string][]*TurnFact) {
	sessions := map[string][]*TurnFact{}
	for i := range f.Turns {
		t := &f.Turns[i]
		if t.Published && t.Batch != nil && t.Batch.State.Terminal() {
			sessions[t.SessionID] = append(sessions[t.SessionID], t)
		}
	}
	for _, ts := range sessions {
		slices.SortFunc(ts, func(a, b *TurnFact) int { return int(a.Seq) - int(b.Seq) })
		var prevEnd time.Time
		var prev *TurnFact
		for _, t := range ts {
			end := t.Batch.UpdatedAt
			start, what := firstSign(t, execs)
			for _, s := range stepsOf[t.ID] {
				if at, w := firstSign(s, execs); !at.IsZero() && (start.IsZero() || at.Before(start)) {
					start, what = at, w
				}
			}
			bad := ""
			switch {
			case prev == nil:
			case !start.IsZero() && start.Before(prevEnd):
				bad = fmt.Sprintf("%s at %s, before earlier turn %s (seq %d) ended at %s", what, stamp(start), prev.ID, prev.Seq, stamp(prevEnd))
			case end.Before(prevEnd):
				bad = fmt.Sprintf("ended (%s) at %s, before earlier turn %s (seq %d) ended at %s", t.Batch.State, stamp(end), prev.ID, prev.Seq, stamp(prevEnd))
			}
			if bad != "" {
				r.SessionOrder++
				r.example("session order", "session %s: turn %s (seq %d, plan %d): %s", t.SessionID, t.ID, t.Seq, t.Plan.Index, bad)
			}
			if end.After(prevEnd) {
				prevEnd, prev = end, t
			}
		}
	}
}

// firstSign is the earliest evidence that t's batch was running.
func firstSign(t *TurnFact, execs map[string][]toolsvc.Execution) (time.Time, string) {
	var at time.Time
	what := ""
	for i := range t.Plan.Calls {
		for _, e := range execs[schemas.CallID(t.ID, i)] {
			if ts := time.Unix(0, e.At); at.IsZero() || ts.Before(at) {
				at, what = ts, "call "+e.CallID+" ran"
			}
		}
		if a := approvalOf(t, i); a != nil && (at.IsZero() || a.RequestedAt.Before(at)) {
			at, what = a.RequestedAt, "approval "+a.ApprovalID+" requested"
		}
	}
	return at, what
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("==== chaos report ====")
	p("parameters: %s", r.Params)
	p("replay:     %s", r.Replay)
	broker := "broker restarts"
	if r.ClusterNodes > 1 {
		broker = fmt.Sprintf("kills of the TOLLGATE_TURNS leader node (of %d, restarted later)", r.ClusterNodes)
	}
	p("faults: %d worker kills (%s), %d %s, %d tool service crash calls, %d unexpected worker exits, %d skipped",
		r.Kills, counts(r.KillsOf), r.BrokerRestarts, broker, r.ToolCrashes, r.UnexpectedExits, r.FaultsSkipped)
	if r.Partitions > 0 {
		p("partitions: %d nodes cut off from their peers while leading the busiest stream, for longer than an election, then healed (see the cluster notes)", r.Partitions)
	}
	if r.LeaderPauses > 0 {
		p("leader pauses: %d nodes stopped (SIGSTOP) while leading the busiest stream, for longer than an election, then continued (see the cluster notes)", r.LeaderPauses)
	}
	if len(r.WriteKills) > 0 {
		fired, at := 0, map[string][]int{}
		for _, w := range r.WriteKills {
			if w.Fired {
				fired++
				at[w.Path] = append(at[w.Path], w.K)
			}
		}
		p("write kills: %d of %d fired (a stage SIGKILLed right after a turn's k-th write); after writes %v of plain turns, %v of approval turns",
			fired, len(r.WriteKills), at[writeKillPlain], at[writeKillSingle])
		for _, w := range r.WriteKills {
			if w.Fired {
				p("   %s after write %d of %s turn %s (%s): %d processes", w.Stage, w.K, w.Path, w.TurnID, w.Write, w.Killed)
			} else {
				p("   not fired: write %d of %s turn %s (the turn made fewer writes, or was not driven)", w.K, w.Path, w.TurnID)
			}
		}
	}
	p("turns: planned %d, published %d, accepted %d, terminal %d", r.Planned, r.Published, r.Accepted, r.Terminal)
	p("executions (ledger lines): %d, %d of them by the remote tool service (%d with the reply lost)", r.Executions, r.RemoteExecutions, r.LostReplies)
	p("terminal states: %s", counts(r.States))
	p("call results: %s", counts(r.Results))
	p("approvals: %s", counts(r.ApprovalsBy))
	p("grants: %d made, %d revoked; %d approvals decided by a grant; %d calls failed at redrive with a GRANT_* code", r.GrantsMade, r.GrantsRevoked, r.ApprovalsByGrant, r.GrantFailures)
	p("decisions rejected: %s", counts(r.Rejections))
	if r.PlannerStates != nil {
		p("planner: turns %s; %d step batches; %d model requests (%d answered steps asked again before their answer was recorded); %d reply events", counts(r.PlannerStates), r.StepBatches, r.ModelRequests, r.RepeatedModelRequests, r.Replies)
	}
	p("repeated identical outcome messages: %d; needs_attention results: %d (%d of calls that never ran); dead letters: %d", r.RepeatedOutcomes, r.NeedsAttention, r.UncertainNotRun, r.DeadLetters)
	drain := "n/a"
	if !r.LastFault.IsZero() && !r.AllTerminal.IsZero() {
		drain = max(r.AllTerminal.Sub(r.LastFault), 0).Round(time.Millisecond).String()
	}
	p("time from the last fault to all turns terminal: %s", drain)
	p("wall time: %v", r.Wall.Round(time.Millisecond))
	p("---- violations ----")
	for _, v := range r.violations() {
		p("%-37s %d", v.label+":", v.n)
	}
	p("TOTAL VIOLATIONS: %d", r.Violations())
	section := func(prefix string, m map[string][]string) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			p("-- %s%s (first %d):", prefix, k, len(m[k]))
			for _, e := range m[k] {
				p("   %s", e)
			}
		}
	}
	section("note: ", r.Notes)
	section("", r.Examples)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
