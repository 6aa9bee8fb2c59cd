package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/tools"
)

// DecisionPlan is what the harness sends for one approval.
type DecisionPlan string

const (
	DecideNone       DecisionPlan = ""            // the call needs no approval
	DecideApprove    DecisionPlan = "approve"     // one approve
	DecideDeny       DecisionPlan = "deny"        // one deny
	DecideApproveDup DecisionPlan = "approve-dup" // approve d1, d1 again (same message id) and d2, concurrently
	DecideDenyDup    DecisionPlan = "deny-dup"    // deny d1 twice and d2, concurrently
	DecideConflict   DecisionPlan = "conflict"    // approve d1 and deny d2 concurrently, then approve d3
	DecideLate       DecisionPlan = "late"        // approve after the approval expired
	// DecideGrant chooses the grant option GrantOption: it approves the
	// call and makes a session grant that decides the session's later
	// calls of the granted tool (tools.LedgerGuardedTool) with no prompt.
	DecideGrant DecisionPlan = "grant"
)

// GrantOption is the grant option the harness policy offers on
// tools.LedgerGuardedTool: a session grant (docs/protocol.md, "Grants").
const GrantOption = "approve-session"

// CallPlan is one proposed call.
type CallPlan struct {
	Tool     string
	Decision DecisionPlan
	// Crash (a call of the remote tool service): the service journals the
	// call and exits without replying, so the reply is lost after the tool
	// acted.
	Crash bool
}

// NeedsApproval reports whether the harness policy makes the call wait for
// an approval.
func (c CallPlan) NeedsApproval() bool {
	return c.Tool == tools.LedgerGuardedTool || c.Tool == tools.LedgerExpiringTool || c.Tool == toolsvc.LedgerGuarded
}

// Remote reports whether the call's tool is the remote tool service's.
func (c CallPlan) Remote() bool { return c.Tool == toolsvc.Ledger || c.Tool == toolsvc.LedgerGuarded }

// crashes reports whether one of t's calls is a crash call.
func (t TurnPlan) crashes() bool {
	return slices.ContainsFunc(t.Calls, func(c CallPlan) bool { return c.Crash })
}

// TurnPlan is one turn (one inbound message).
type TurnPlan struct {
	Index   int
	Session int
	Kind    string
	// Burst: published right after the session's previous turn, without
	// waiting for it to end.
	Burst bool
	Calls []CallPlan
	// Steps (a planner turn: text only, Calls empty) are the tool calls
	// the scripted model proposes in its steps, one batch each; its last
	// step (index len(Steps)) is the final answer, ReplyText.
	Steps [][]CallPlan
	// Revoke: before it decides the turn's remote guarded call (which no
	// grant covers), the harness revokes every grant its session made so
	// far. The batch cannot be redriven before that decision, so the
	// turn's calls those grants already approved must fail at redrive
	// (GRANT_REVOKED) and not run.
	Revoke bool
}

// Planner reports whether t is a planner turn.
func (t TurnPlan) Planner() bool { return t.Kind == plannerKind }

// Text is the inbound message's text of t: for a planner turn, the
// conversation the scripted model answers.
func (t TurnPlan) Text() string { return fmt.Sprintf("chaos turn %d (%s)", t.Index, t.Kind) }

// ReplyText is the final answer the scripted model gives planner turn t.
func (t TurnPlan) ReplyText() string { return fmt.Sprintf("done with chaos turn %d", t.Index) }

// StepArgs are the arguments the scripted model gives call i of step n of
// planner turn t (unique per call: the ledger tools record them).
func (t TurnPlan) StepArgs(n, i int) string {
	return fmt.Sprintf(`{"turn":%d,"call":%d}`, t.Index, 100*(n+1)+i)
}

// StepCall returns the index in t.Steps[n] of the planned call whose
// arguments are args (as StepArgs wrote them, in any key order), and false
// when args are not one of step n's calls.
//
// A step batch is not its plan by position: the planner leaves out of the
// batch every call its check refuses (a tool the catalog does not have
// while every replica of the remote tool service is down: TOOL_NOT_FOUND,
// told to the model as the call's result) and numbers the remaining calls
// from 0 (schemas.PlannerCall.BatchIndex). So the harness finds a batch
// call's plan by its arguments, which name it.
func (t TurnPlan) StepCall(n int, args string) (int, bool) {
	var a struct {
		Turn *int `json:"turn"`
		Call *int `json:"call"`
	}
	if json.Unmarshal([]byte(args), &a) != nil || a.Turn == nil || a.Call == nil || *a.Turn != t.Index || n < 0 || n >= len(t.Steps) {
		return 0, false
	}
	i := *a.Call - 100*(n+1)
	if i < 0 || i >= len(t.Steps[n]) {
		return 0, false
	}
	return i, true
}

// Fault is one injected fault.
type Fault struct {
	AtTurn  int           // injected once this many turns have been published...
	Jitter  time.Duration // ...and this much later
	Broker  bool          // the nats-server (in a cluster: the node leading TOLLGATE_TURNS); else Stage/Replica
	Leader  bool          // Broker in a cluster
	Stage   string
	Replica int
	Down    time.Duration // how long the process stays dead before it is restarted
	// Pause (with Broker, in a cluster): SIGSTOP the node leading the
	// busiest stream for Down, then SIGCONT; nothing is killed.
	Pause bool
	// Partition (with Broker, in a cluster): cut the node leading the
	// busiest stream off from its peers for Down, then heal the cut.
	Partition bool
}

func (f Fault) String() string {
	if f.Partition {
		return fmt.Sprintf("cut the node leading the busiest stream off from its peers at turn %d+%v, for %v", f.AtTurn, f.Jitter.Round(time.Millisecond), f.Down.Round(time.Millisecond))
	}
	if f.Pause {
		return fmt.Sprintf("pause (SIGSTOP) the node leading the busiest stream at turn %d+%v, for %v", f.AtTurn, f.Jitter.Round(time.Millisecond), f.Down.Round(time.Millisecond))
	}
	target := "nats-server"
	if f.Leader {
		target = "the node leading TOLLGATE_TURNS"
	}
	if !f.Broker {
		target = fmt.Sprintf("%s-%d", f.Stage, f.Replica)
	}
	return fmt.Sprintf("kill %s at turn %d+%v, down %v", target, f.AtTurn, f.Jitter.Round(time.Millisecond), f.Down.Round(time.Millisecond))
}

// Plan is a run's turn mix and fault schedule: a pure function of the
// configuration (and so of the seed).
type Plan struct {
	Turns    []TurnPlan
	Sessions [][]int // turn indexes of each session, in publishing order
	Faults   []Fault // in schedule order
	// WriteKills (Config.WriteKills) are armed on their turns before the
	// drive and fire on the turn's writes (writekill.go), not at a count
	// of published turns.
	WriteKills []WriteKillPlan
}

// Stages in pipeline order (the binaries' names).
var Stages = []string{"ingest", "executor", "approver", "redriver"}

// ToolService is the remote tool service's binary (internal/chaos/chaostool,
// serving internal/chaos/toolsvc), run as Replicas processes in one queue
// group.
const ToolService = "chaostool"

// Workers are the processes worker kills pick from: the stages and the
// tool service (and the planner, in planner mode: Config.workers).
var Workers = append(slices.Clone(Stages), ToolService)

// PlannerStage is the planner's binary, run in planner mode.
const PlannerStage = "planner"

// stages are the stage binaries of a run of c.
func (c Config) stages() []string {
	if c.Planner {
		return append(slices.Clone(Stages), PlannerStage)
	}
	return Stages
}

// workers are the processes worker kills of a run of c pick from.
func (c Config) workers() []string {
	if len(c.KillOnly) > 0 {
		return c.KillOnly
	}
	return append(slices.Clone(c.stages()), ToolService)
}

// plannerKind is the kind of a planner turn.
const plannerKind = "planner"

// turn kinds and their weights (percent).
var kinds = []struct {
	name   string
	weight int
}{
	{"plain", 28},   // only calls that need no approval
	{"single", 24},  // one approval
	{"multi", 24},   // two to four approvals, decided independently (approve, deny, duplicates, conflicts)
	{"dup", 10},     // one approval decided several times
	{"conflict", 8}, // approve and deny of one approval at the same time
	{"expiry", 6},   // an approval that expires before its (late) decision
}

// NewPlan derives the plan of c.
func NewPlan(c Config) Plan {
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x70_11_6a_7e))
	var p Plan
	for len(p.Turns) < c.Turns {
		s := len(p.Sessions)
		n := min(1+rng.IntN(c.MaxSessionTurns), c.Turns-len(p.Turns))
		var idx []int
		for j := range n {
			t := TurnPlan{Index: len(p.Turns), Session: s, Burst: j > 0 && rng.IntN(100) < c.BurstPercent}
			if c.Planner && rng.IntN(100) < c.PlannerPercent {
				t.Kind, t.Steps = plannerKind, plannerMix(rng)
			} else {
				t.Kind, t.Calls = turnMix(rng)
			}
			idx = append(idx, t.Index)
			p.Turns = append(p.Turns, t)
		}
		p.Sessions = append(p.Sessions, idx)
	}

	planGrants(c, &p)

	from, to := int(c.FaultFrom*float64(c.Turns)), max(int(c.FaultTo*float64(c.Turns)), int(c.FaultFrom*float64(c.Turns))+1)
	planCrashes(rng, &p, c.ToolCrashes, to)
	// Kills go round the workers from a random one, so that Kills >=
	// len(Workers) kills every kind of worker.
	workers := c.workers()
	first := rng.IntN(len(workers))
	for k := range c.Kills {
		p.Faults = append(p.Faults, Fault{
			AtTurn: from + rng.IntN(to-from), Jitter: jitter(rng, 500*time.Millisecond),
			Stage: workers[(first+k)%len(workers)], Replica: 1 + rng.IntN(c.Replicas),
			Down: 50*time.Millisecond + jitter(rng, 1500*time.Millisecond),
		})
	}
	for i := range c.BrokerRestarts {
		// Spread evenly over the fault window, with some play.
		span := (to - from) / (c.BrokerRestarts + 1)
		at := from + span*(i+1) + rng.IntN(max(span/2, 1)) - span/4
		f := Fault{
			AtTurn: max(at, from), Jitter: jitter(rng, 500*time.Millisecond), Broker: true,
			Down: 200*time.Millisecond + jitter(rng, 1300*time.Millisecond),
		}
		if c.Clustered() {
			// A cluster node stays away long enough for the others to
			// elect new leaders (4 to 9 s after a crash) and then carry the
			// load without it for a while.
			f.Leader, f.Down = true, 10*time.Second+2*f.Down
		}
		p.Faults = append(p.Faults, f)
	}
	planLeaderPauses(c, &p, from, to)
	planPartitions(c, &p, from, to)
	planWriteKills(c, &p, from, to)
	slices.SortStableFunc(p.Faults, func(a, b Fault) int { return a.AtTurn - b.AtTurn })
	return p
}

// planLeaderPauses adds the leader pauses, each at a random turn of its
// share of the fault window, from a random source of its own (the rest of
// a seed's plan is what it was without them). A pause lasts longer than
// an election (4 to 9 s after the leader goes quiet), so the others elect
// new leaders while the paused node still believes it leads.
func planLeaderPauses(c Config, p *Plan, from, to int) {
	planLeaderFaults(p, from, to, c.LeaderPauses, rand.New(rand.NewPCG(uint64(c.Seed), 0x5e_a5_0f_f5)), func(f *Fault) { f.Pause = true })
}

// planPartitions adds the partitions as planLeaderPauses adds the pauses,
// from a random source of their own.
func planPartitions(c Config, p *Plan, from, to int) {
	planLeaderFaults(p, from, to, c.Partitions, rand.New(rand.NewPCG(uint64(c.Seed), 0x9a_27_17_10)), func(f *Fault) { f.Partition = true })
}

// planLeaderFaults adds n faults of the node leading the busiest stream,
// each at a random turn of its share of [from, to) and lasting 12 to 15
// s, drawn from rng; kind marks what the fault does.
func planLeaderFaults(p *Plan, from, to, n int, rng *rand.Rand, kind func(*Fault)) {
	for i := range n {
		span := max((to-from)/n, 1)
		f := Fault{
			AtTurn: from + span*i + rng.IntN(span), Jitter: jitter(rng, 500*time.Millisecond), Broker: true, Leader: true,
			Down: 12*time.Second + jitter(rng, 3*time.Second),
		}
		kind(&f)
		p.Faults = append(p.Faults, f)
	}
}

// planGrants turns about a third of the single approves of
// tools.LedgerGuardedTool calls into DecideGrant, and marks Revoke each
// later turn of such a session that has a remote guarded call (one no
// grant covers, and that waits for the harness, which revokes first; an
// expiring call could end its wait while the revocation is under way). It draws from a random source of its
// own, so the turn mix and fault schedule of a seed are those it had
// before grants.
func planGrants(c Config, p *Plan) {
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x6a_27_5e_01))
	for _, idx := range p.Sessions {
		granted := false
		for _, i := range idx {
			t := &p.Turns[i]
			if granted && slices.ContainsFunc(t.Calls, func(c CallPlan) bool { return c.Tool == toolsvc.LedgerGuarded }) {
				t.Revoke = true
			}
			for j := range t.Calls {
				if cp := &t.Calls[j]; cp.Tool == tools.LedgerGuardedTool && cp.Decision == DecideApprove && rng.IntN(3) == 0 {
					cp.Decision, granted = DecideGrant, true
				}
			}
		}
	}
}

// planCrashes marks n calls of the remote tool that runs at once
// (toolsvc.Ledger) as crash calls, taken at random among those of the
// turns after the fault window (from turn to on), and among earlier turns
// only if there are too few. The driver sends a turn with a crash call
// only once every planned fault has been injected (driver.runSession).
func planCrashes(rng *rand.Rand, p *Plan, n, to int) {
	type ref struct{ turn, call int }
	var late, early []ref
	for i := range p.Turns {
		for j, c := range p.Turns[i].Calls {
			switch {
			case c.Tool != toolsvc.Ledger:
			case i >= to:
				late = append(late, ref{i, j})
			default:
				early = append(early, ref{i, j})
			}
		}
	}
	rng.Shuffle(len(late), func(i, j int) { late[i], late[j] = late[j], late[i] })
	rng.Shuffle(len(early), func(i, j int) { early[i], early[j] = early[j], early[i] })
	for _, r := range append(late, early...)[:min(n, len(late)+len(early))] {
		p.Turns[r.turn].Calls[r.call].Crash = true
	}
}

func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(d)))
}

func pick(rng *rand.Rand) string {
	n := rng.IntN(100)
	for _, k := range kinds {
		if n < k.weight {
			return k.name
		}
		n -= k.weight
	}
	return kinds[0].name
}

// plannerMix draws the tool steps of a planner turn's script: none (a
// direct answer) now and then, else one or two steps of one or two calls:
// ledger tools that run at once (in process or remote), gated ones the
// harness decides, and now and then one the policy denies (never offered
// to the model, asked for anyway).
func plannerMix(rng *rand.Rand) [][]CallPlan {
	if rng.IntN(8) == 0 {
		return nil
	}
	steps := make([][]CallPlan, 1+rng.IntN(2))
	for n := range steps {
		for range 1 + rng.IntN(2) {
			var c CallPlan
			switch k := rng.IntN(10); {
			case k < 3:
				c = CallPlan{Tool: tools.LedgerTool}
			case k < 5:
				c = CallPlan{Tool: toolsvc.Ledger}
			case k < 9:
				tool := tools.LedgerGuardedTool
				if rng.IntN(3) == 0 {
					tool = toolsvc.LedgerGuarded
				}
				c = CallPlan{Tool: tool, Decision: []DecisionPlan{DecideApprove, DecideApprove, DecideDeny, DecideApproveDup, DecideConflict}[rng.IntN(5)]}
			default:
				c = CallPlan{Tool: tools.LedgerDeniedTool}
			}
			steps[n] = append(steps[n], c)
		}
	}
	return steps
}

// turnMix draws one turn's calls.
func turnMix(rng *rand.Rand) (string, []CallPlan) {
	kind := pick(rng)
	plain := func(n int) []CallPlan {
		cs := make([]CallPlan, n)
		for i := range cs {
			cs[i] = CallPlan{Tool: tools.LedgerTool}
			if rng.IntN(3) == 0 {
				cs[i].Tool = toolsvc.Ledger
			}
		}
		return cs
	}
	guarded := func(d DecisionPlan) CallPlan {
		if rng.IntN(3) == 0 {
			return CallPlan{Tool: toolsvc.LedgerGuarded, Decision: d}
		}
		return CallPlan{Tool: tools.LedgerGuardedTool, Decision: d}
	}
	var calls []CallPlan
	switch kind {
	case "plain":
		calls = plain(1 + rng.IntN(3))
	case "single":
		calls = append(plain(rng.IntN(2)), guarded(DecideApprove))
		if rng.IntN(4) == 0 {
			calls[len(calls)-1].Decision = DecideDeny
		}
	case "multi":
		calls = plain(rng.IntN(3))
		for range 2 + rng.IntN(3) {
			d := []DecisionPlan{DecideApprove, DecideApprove, DecideApprove, DecideDeny, DecideApproveDup, DecideConflict}[rng.IntN(6)]
			calls = append(calls, guarded(d))
		}
	case "dup":
		calls = append(plain(rng.IntN(2)), guarded([]DecisionPlan{DecideApproveDup, DecideApproveDup, DecideDenyDup}[rng.IntN(3)]))
	case "conflict":
		calls = []CallPlan{guarded(DecideConflict)}
		if rng.IntN(2) == 0 {
			calls = append(calls, guarded(DecideConflict))
		}
	case "expiry":
		calls = []CallPlan{{Tool: tools.LedgerExpiringTool, Decision: DecideLate}}
		if rng.IntN(2) == 0 {
			calls = append(calls, guarded(DecideApprove))
		}
	}
	// Now and then a call the policy denies outright: it must never run.
	if rng.IntN(10) == 0 {
		calls = append(calls, CallPlan{Tool: tools.LedgerDeniedTool})
	}
	rng.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })
	return kind, calls
}
