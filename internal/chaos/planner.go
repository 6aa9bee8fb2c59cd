package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Planner mode (Config.Planner): the planner turns of the plan are
// text-only messages that replicated planner processes drive against the
// harness's scripted model. The model answers step n of a turn's
// conversation (its text) with the turn's Steps[n] as tool calls, and the
// step after the last with the final text; it records every request with
// its arrival time, which the checks compare with the planner's step
// records.

// modelGrace is how long after a step's record was created a request for
// that step may still arrive without being a duplicate: a planner worker
// that read the step unrecorded an instant before another recorded it asks
// too (the package planner's contract: it then keeps the recorded answer
// and drops its own). A planner asks within milliseconds of its read; a
// request later than this was sent by a worker that should have found the
// record.
const modelGrace = time.Second

// startModel starts the scripted model with the script of every planner
// turn of plan.
func startModel(plan Plan) (*plannertest.Server, error) {
	m, err := plannertest.Start()
	if err != nil {
		return nil, err
	}
	for _, t := range plan.Turns {
		if !t.Planner() {
			continue
		}
		var replies []plannertest.Reply
		for n, calls := range t.Steps {
			var r plannertest.Reply
			for i, c := range calls {
				// Function names may not hold dots: the planner offers a
				// dotted tool name with "__" in place of each dot.
				r.Calls = append(r.Calls, plannertest.Call{Name: strings.ReplaceAll(c.Tool, ".", "__"), Args: t.StepArgs(n, i)})
			}
			replies = append(replies, r)
		}
		m.Script(t.Text(), append(replies, plannertest.Reply{Text: t.ReplyText()})...)
	}
	return m, nil
}

// ModelRequest is one request the scripted model received.
type ModelRequest struct {
	TurnID string // the planner turn whose conversation it is ("" if none)
	Step   int
	At     time.Time
	Status int // what the model answered
}

// PlannerFacts are what the planner stored for the planner turns.
type PlannerFacts struct {
	Turns    map[string]*schemas.PlannerTurn   // by turn id
	Steps    map[string][]*schemas.PlannerStep // by turn id, by step index (nil: not recorded)
	Replies  map[string][]*schemas.ReplyEvent  // every stored reply event, by turn id
	Requests []ModelRequest
}

// gatherPlanner reads the planner's records of the published planner turns,
// their step batches (as TurnFacts in f.Steps), the reply events and the
// model's requests.
func (h *harness) gatherPlanner(ctx context.Context, js jetstream.JetStream, d *driver, f *Facts) error {
	kv, err := js.KeyValue(ctx, topology.BucketPlanner)
	if err != nil {
		return fmt.Errorf("planner bucket: %w", err)
	}
	turns := store.Bucket[schemas.PlannerTurn, *schemas.PlannerTurn]{KV: kv}
	steps := store.Bucket[schemas.PlannerStep, *schemas.PlannerStep]{KV: kv}
	pf := &PlannerFacts{Turns: map[string]*schemas.PlannerTurn{}, Steps: map[string][]*schemas.PlannerStep{}, Replies: map[string][]*schemas.ReplyEvent{}}
	byText := map[string]string{}
	for _, rf := range f.Turns {
		if !rf.Plan.Planner() {
			continue
		}
		byText[rf.Plan.Text()] = rf.ID
		if !rf.Published {
			continue
		}
		if pf.Turns[rf.ID], err = read(ctx, "planner turn "+rf.ID, func() (*schemas.PlannerTurn, uint64, error) { return turns.Get(ctx, rf.ID) }); err != nil {
			return err
		}
		recs := make([]*schemas.PlannerStep, len(rf.Plan.Steps)+1)
		for n := range recs {
			key := schemas.PlannerStepKey(rf.ID, n)
			if recs[n], err = read(ctx, "planner step "+key, func() (*schemas.PlannerStep, uint64, error) { return steps.Get(ctx, key) }); err != nil {
				return err
			}
		}
		pf.Steps[rf.ID] = recs
		for n, planned := range rf.Plan.Steps {
			calls, ok := stepBatchCalls(rf.Plan, n, planned, recs[n])
			if !ok {
				continue // the planner refused every call of the step: no batch
			}
			sf := TurnFact{
				Plan: TurnPlan{Index: rf.Plan.Index, Session: rf.Plan.Session, Kind: "planner step", Calls: calls},
				ID:   schemas.PlannerStepTurnID(rf.ID, n), StepOf: rf.ID, SessionID: rf.SessionID, Principal: rf.Principal, Published: true, Seq: rf.Seq,
			}
			if sf.Batch, err = read(ctx, "batch "+sf.ID, func() (*schemas.BatchRecord, uint64, error) { return d.st.Batches.Get(ctx, sf.ID) }); err != nil {
				return err
			}
			sf.Approvals = make([]*schemas.ApprovalRecord, len(calls))
			for i := range calls {
				id := schemas.ApprovalID(sf.ID, i)
				if sf.Approvals[i], err = read(ctx, "approval "+id, func() (*schemas.ApprovalRecord, uint64, error) { return d.st.Approvals.Get(ctx, id) }); err != nil {
					return err
				}
			}
			f.Steps = append(f.Steps, sf)
		}
	}
	err = topology.Retry(ctx, func() error {
		clear(pf.Replies)
		return bus.Scan(ctx, js, topology.StreamEvents, topology.SubjectTurnReply+">", func(m jetstream.Msg) error {
			e, err := schemas.Decode[schemas.ReplyEvent](m.Data())
			if err != nil {
				return fmt.Errorf("reply event on %s: %w", m.Subject(), err)
			}
			pf.Replies[e.TurnID] = append(pf.Replies[e.TurnID], e)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read the reply events: %w", err)
	}
	for _, r := range h.model.Requests("") {
		pf.Requests = append(pf.Requests, ModelRequest{TurnID: byText[r.Conversation], Step: r.Step, At: r.At, Status: r.Status})
	}
	f.Planner = pf
	return nil
}

// stepBatchCalls returns the planned calls of step n's batch in the
// batch's order: the calls of the recorded step rec that joined the batch
// (BatchIndex >= 0), each the planned call its arguments name
// (TurnPlan.StepCall). Without a record it is the plan (the batch, if any,
// is then checked as the plan's). It returns false when the recorded step
// made no batch: the planner refused every call (told the model so), and
// no batch is owed.
func stepBatchCalls(plan TurnPlan, n int, planned []CallPlan, rec *schemas.PlannerStep) ([]CallPlan, bool) {
	if rec == nil {
		return planned, true
	}
	if rec.Batch == "" {
		return nil, false
	}
	var calls []CallPlan
	for _, c := range rec.Calls {
		if c.BatchIndex < 0 {
			continue
		}
		p, ok := plan.StepCall(n, c.Args)
		if !ok || c.BatchIndex != len(calls) {
			// Not the harness's call, or out of order: check the batch
			// against the plan, which then reports it.
			return planned, true
		}
		calls = append(calls, planned[p])
	}
	return calls, true
}

// checkPlanner adds the planner's checks: no model step asked again after
// its answer was recorded (duplicate model steps), each step batch made of
// its recorded step's calls, and a completed planner turn's reply event
// published (once or more, identical) under the turn's own context: its
// session, the reply target and audience of its outcome, the model's final
// text; no reply for any other turn.
func checkPlanner(r *Report, f *Facts, byID map[string]*TurnFact) {
	pf := f.Planner
	if pf == nil {
		return
	}
	r.PlannerStates = map[string]int{}
	for id, pt := range pf.Turns {
		if pt == nil {
			r.PlannerStates["no record"]++
			r.example("planner turn without a record", "turn %s", id)
			continue
		}
		state := string(pt.State)
		if pt.Code != "" {
			state += ":" + string(pt.Code)
		}
		r.PlannerStates[state]++
	}

	// Duplicate model steps.
	answered := map[string]int{}
	for _, q := range pf.Requests {
		r.ModelRequests++
		if q.TurnID == "" {
			r.example("model request of no planner turn", "step %d at %s", q.Step, stamp(q.At))
			continue
		}
		if q.Status != 200 {
			continue
		}
		key := fmt.Sprintf("%s step %d", q.TurnID, q.Step)
		if answered[key]++; answered[key] > 1 {
			r.RepeatedModelRequests++
			r.note("model step asked again before its answer was recorded", "%s at %s", key, stamp(q.At))
		}
		recs := pf.Steps[q.TurnID]
		if q.Step < len(recs) && recs[q.Step] != nil && q.At.After(recs[q.Step].CreatedAt.Add(modelGrace)) {
			r.DuplicateModelSteps++
			r.example("duplicate model step", "%s asked at %s, recorded at %s", key, stamp(q.At), stamp(recs[q.Step].CreatedAt))
		}
	}

	// Calls the planner refused (told to the model, in no batch): not a
	// violation (the harness's tool service may be down long enough for
	// its tools to leave the catalog), but worth seeing in the notes.
	for id, recs := range pf.Steps {
		for _, rec := range recs {
			if rec == nil {
				continue
			}
			for _, c := range rec.Calls {
				if c.Code != "" {
					r.note("planner step call refused", "%s step %d call %s (%s): %s", id, rec.Index, c.ID, c.Tool, c.Code)
				}
			}
		}
	}

	// Step batches are their recorded steps' calls.
	for i := range f.Steps {
		s := &f.Steps[i]
		_, n, _ := schemas.PlannerStepOf(s.ID)
		recs := pf.Steps[s.StepOf]
		if s.Batch == nil || n >= len(recs) || recs[n] == nil {
			continue // a lost turn, counted there
		}
		var want []string
		for _, c := range recs[n].Calls {
			if c.BatchIndex >= 0 {
				want = append(want, c.Tool)
			}
		}
		var got []string
		for _, c := range s.Batch.Calls {
			got = append(got, c.Tool)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") || s.Batch.Origin != s.StepOf {
			r.StepBatchMismatch++
			r.example("step batch unlike its recorded step", "batch %s (origin %q): calls %v, step %d recorded %v", s.ID, s.Batch.Origin, got, n, want)
		}
	}

	// Replies.
	for id, es := range pf.Replies {
		t := byID[id]
		if t == nil || !t.Plan.Planner() {
			r.WrongReplies += len(es)
			r.example("reply under another context", "reply event for turn %s, which is no planner turn", id)
		}
	}
	for i := range f.Turns {
		t := &f.Turns[i]
		if !t.Plan.Planner() || t.Batch == nil || !t.Batch.State.Terminal() {
			continue
		}
		es, outs := pf.Replies[t.ID], f.Outcomes[t.ID]
		r.Replies += len(es)
		completed := t.Batch.State == schemas.BatchCompleted
		switch {
		case completed && len(es) == 0:
			r.WrongReplies++
			r.example("reply under another context", "planner turn %s completed without a reply event", t.ID)
		case !completed && len(es) > 0:
			r.WrongReplies += len(es)
			r.example("reply under another context", "planner turn %s ended %s but has %d reply events", t.ID, t.Batch.State, len(es))
		}
		for _, e := range es {
			var bad []string
			if e.SessionID != t.SessionID {
				bad = append(bad, "session "+e.SessionID)
			}
			if e.Text != t.Plan.ReplyText() {
				bad = append(bad, fmt.Sprintf("text %q", e.Text))
			}
			if len(outs) > 0 && (e.Reply != outs[0].Reply || e.Audience != outs[0].Audience) {
				bad = append(bad, fmt.Sprintf("reply target %+v audience %s, the outcome's %+v %s", e.Reply, e.Audience, outs[0].Reply, outs[0].Audience))
			}
			if len(bad) > 0 {
				r.WrongReplies++
				r.example("reply under another context", "turn %s: %s", t.ID, strings.Join(bad, "; "))
			}
		}
	}
}
