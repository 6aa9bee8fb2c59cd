package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/sessionorder"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

func (p *Planner) now() time.Time { return p.cfg.Engine.Now() }

// authorize reports whether tc is an authentic authority for turnID: sealed
// by a key of the ring and captured for turnID.
func (p *Planner) authorize(tc *schemas.TurnContext, turnID string) error {
	if tc == nil {
		return schemas.Errorf(schemas.CodeTurnContextMissing, "turn %s has no TurnContext", turnID)
	}
	if err := p.cfg.Engine.Keys().Verify(tc); err != nil {
		return err
	}
	return tc.CheckFor(turnID)
}

// Accept records the planner turn of t (once) and drives it. A turn whose
// TurnContext does not verify is failed closed at once: no model is asked.
func (p *Planner) Accept(ctx context.Context, t *schemas.AcceptedTurn) error {
	return p.accept(ctx, t, nil)
}

// accept is Accept of a turn that came as entry of its session's order
// (nil: it did not): the planner turn, and then the loop's batch record,
// keep the place the entry gives it (turnorder.Entry.Place).
func (p *Planner) accept(ctx context.Context, t *schemas.AcceptedTurn, entry *turnorder.Entry) error {
	if err := schemas.CheckTurnKey(t.TurnID); err != nil {
		return err
	}
	now := p.now()
	tr := &schemas.PlannerTurn{TurnID: t.TurnID, Context: t.Context, Text: t.Text, State: schemas.PlannerQueued, UpdatedAt: now}
	if t.Context != nil {
		tr.SessionID = t.Context.SessionID
	}
	if entry != nil && entry.Repeated() {
		// A repeat places nothing: the turn's first entry, earlier in the
		// order, records it.
		if _, _, err := p.turns.Get(ctx, t.TurnID); errors.Is(err, store.ErrNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		return p.Drive(ctx, t.TurnID)
	}
	placed, err := p.cfg.Engine.Place(ctx, entry)
	if err != nil {
		return err
	}
	tr.OrderSeq, tr.OrderAfter = placed.Seq, placed.After
	if err := p.authorize(t.Context, t.TurnID); err != nil {
		p.cfg.Logger.Warn("planner turn failed closed", "turn", t.TurnID, "err", err)
		tr.State, tr.Code, tr.Reason = schemas.PlannerFailed, schemas.CodeOf(err), schemas.ReasonOf(err)
		if tr.OrderSeq != 0 && tr.SessionID != "" {
			// It ends in its turn, as every placed batch does: the
			// failed turn is recorded, and Drive ends its batch now or
			// when its predecessor's end announces it.
			if _, err := p.turns.Create(ctx, t.TurnID, tr); err != nil && !errors.Is(err, store.ErrExists) {
				return err
			}
			return p.Drive(ctx, t.TurnID)
		}
		return p.endBatch(ctx, tr)
	}
	if _, err := p.turns.Create(ctx, t.TurnID, tr); err != nil && !errors.Is(err, store.ErrExists) {
		return err
	}
	return p.Drive(ctx, t.TurnID)
}

// Drive moves the loop of planner turn turnID as far as it can go from its
// records: it starts the loop if its session lets it, asks the model for
// the current step unless it is recorded, schedules the step's batch, or
// ends the turn. It returns once the loop waits for a batch or for its
// session, or has ended. It is idempotent.
func (p *Planner) Drive(ctx context.Context, turnID string) error {
	for {
		tr, rev, err := p.turns.Get(ctx, turnID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return schemas.Errorf(schemas.CodeInvalidInput, "no planner turn %s", turnID)
		case err != nil:
			return err
		}
		switch tr.State {
		case schemas.PlannerCompleted, schemas.PlannerFailed:
			return p.finish(ctx, tr)
		case schemas.PlannerQueued:
			started, err := p.start(ctx, tr)
			if err != nil || !started {
				return err
			}
			if _, _, err := p.turns.MutateFrom(ctx, turnID, tr, rev, func(t *schemas.PlannerTurn) error {
				if t.State != schemas.PlannerQueued {
					return store.ErrSkip
				}
				t.State, t.StartedAt, t.UpdatedAt = schemas.PlannerRunning, p.now(), p.now()
				return nil
			}); err != nil {
				return err
			}
			continue
		}

		st, _, err := p.steps.Get(ctx, schemas.PlannerStepKey(turnID, tr.Step))
		switch {
		case errors.Is(err, store.ErrNotFound):
			by, err := p.supersededBy(ctx, tr)
			if err != nil {
				return err
			}
			if by != "" {
				return p.end(ctx, turnID, schemas.PlannerFailed, schemas.CodeTurnSuperseded, "superseded by turn "+by, nil)
			}
			if code, reason := p.overBudget(tr); code != "" {
				return p.end(ctx, turnID, schemas.PlannerFailed, code, reason, nil)
			}
			st, err = p.ask(ctx, tr)
			if schemas.Permanent(err) {
				if c := schemas.CodeOf(err); c == schemas.CodeLLMUnavailable || c == schemas.CodeLLMBadResponse {
					p.modelErrors.WithLabelValues(string(c)).Inc()
				}
				return p.end(ctx, turnID, schemas.PlannerFailed, schemas.CodeOf(err), schemas.ReasonOf(err), nil)
			}
			if err != nil {
				return err
			}
		case schemas.Permanent(err):
			return p.end(ctx, turnID, schemas.PlannerFailed, schemas.CodeOf(err), schemas.ReasonOf(err), nil)
		case err != nil:
			return err
		}
		if st.Final() {
			return p.end(ctx, turnID, schemas.PlannerCompleted, "", st.Text, st)
		}
		if !st.Ended {
			if st.Batch != "" {
				return p.submit(ctx, tr, st) // the loop goes on when its outcome arrives
			}
			// No call could run: the errors go back to the model at once.
			if st, _, err = p.steps.Mutate(ctx, schemas.PlannerStepKey(turnID, st.Index), func(s *schemas.PlannerStep) error {
				if s.Ended {
					return store.ErrSkip
				}
				s.Ended = true
				return nil
			}); err != nil {
				return err
			}
		}
		if _, _, err := p.turns.MutateFrom(ctx, turnID, tr, rev, func(t *schemas.PlannerTurn) error {
			if t.State != schemas.PlannerRunning || t.Step != st.Index {
				return store.ErrSkip
			}
			t.Step++
			t.TokensIn += st.TokensIn
			t.TokensOut += st.TokensOut
			t.UpdatedAt = p.now()
			return nil
		}); err != nil {
			return err
		}
	}
}

// StepEnded stores the results of the batch of step n of planner turn root
// on the step, once, and drives the loop on. An outcome of a turn that is
// not a planner turn's step is ignored.
func (p *Planner) StepEnded(ctx context.Context, root string, n int) error {
	if _, _, err := p.turns.Get(ctx, root); errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil && !schemas.Permanent(err) {
		return err
	}
	key := schemas.PlannerStepKey(root, n)
	st, rev, err := p.steps.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil && !schemas.Permanent(err) {
		return err
	}
	if err == nil && !st.Ended && st.Batch == schemas.PlannerStepTurnID(root, n) {
		b, _, err := p.cfg.Store.Batches.Get(ctx, st.Batch)
		if err != nil {
			return fmt.Errorf("planner: step %d of %s: %w", n, root, err)
		}
		if !b.State.Terminal() {
			return fmt.Errorf("planner: step batch %s is %s, not terminal", b.TurnID, b.State)
		}
		results := make([]schemas.ToolResult, len(b.Calls))
		for i, c := range b.Calls {
			if i < len(b.Results) && b.Results[i] != nil {
				results[i] = *b.Results[i]
				continue
			}
			results[i] = schemas.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: schemas.ResultFailed, Code: b.Code, Reason: b.Reason}
		}
		if _, _, err := p.steps.MutateFrom(ctx, key, st, rev, func(s *schemas.PlannerStep) error {
			if s.Ended {
				return store.ErrSkip
			}
			s.Results, s.Ended = results, true
			return nil
		}); err != nil {
			return err
		}
	}
	return p.Drive(ctx, root)
}

// overBudget returns BUDGET_EXHAUSTED and why, if the loop of tr may not
// take another step.
func (p *Planner) overBudget(tr *schemas.PlannerTurn) (schemas.Code, string) {
	b := p.cfg.Budget
	switch {
	case tr.Step >= b.MaxSteps:
		return schemas.CodeBudgetExhausted, fmt.Sprintf("%d model steps taken, the limit", tr.Step)
	case tr.TokensIn+tr.TokensOut >= b.MaxTokens:
		return schemas.CodeBudgetExhausted, fmt.Sprintf("%d tokens used, limit %d", tr.TokensIn+tr.TokensOut, b.MaxTokens)
	case p.now().Sub(tr.StartedAt) >= b.MaxWall:
		return schemas.CodeBudgetExhausted, fmt.Sprintf("the loop has run %v, limit %v", p.now().Sub(tr.StartedAt).Round(time.Second), b.MaxWall)
	}
	return "", ""
}

// ask asks the model for step tr.Step and records the answer (KV create).
// If another worker recorded the step first, its answer is returned.
func (p *Planner) ask(ctx context.Context, tr *schemas.PlannerTurn) (*schemas.PlannerStep, error) {
	if err := p.authorize(tr.Context, tr.TurnID); err != nil {
		return nil, err
	}
	var earlier []*schemas.PlannerStep
	for i := range tr.Step {
		s, _, err := p.steps.Get(ctx, schemas.PlannerStepKey(tr.TurnID, i))
		if err != nil {
			return nil, err
		}
		earlier = append(earlier, s)
	}
	tools, names := p.offer(ctx, tr.Context)
	msgs, err := p.messages(ctx, tr, earlier)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	a, err := p.model.ask(ctx, msgs, tools)
	p.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	p.tokens.WithLabelValues("in").Add(float64(a.tokensIn))
	p.tokens.WithLabelValues("out").Add(float64(a.tokensOut))
	st := &schemas.PlannerStep{TurnID: tr.TurnID, Index: tr.Step, Text: a.text, TokensIn: a.tokensIn, TokensOut: a.tokensOut, CreatedAt: p.now()}
	inBatch := 0
	for i, c := range a.calls {
		pc := schemas.PlannerCall{ID: c.id, Tool: c.name, Args: c.args, BatchIndex: -1}
		if pc.ID == "" || slices.ContainsFunc(st.Calls, func(o schemas.PlannerCall) bool { return o.ID == pc.ID }) {
			pc.ID = fmt.Sprintf("call_%d_%d", tr.Step, i)
		}
		if tool, ok := names[c.name]; ok {
			pc.Tool = tool
		}
		err := p.check(ctx, c.kind, pc.Tool, c.args)
		if err == nil && inBatch >= schemas.MaxCalls {
			err = schemas.Errorf(schemas.CodeInvalidInput, "more than %d tool calls in one step", schemas.MaxCalls)
		}
		if err != nil {
			pc.Code, pc.Reason = schemas.CodeOf(err), clip(schemas.ReasonOf(err), 1024)
		} else {
			pc.BatchIndex = inBatch
			inBatch++
		}
		st.Calls = append(st.Calls, pc)
	}
	if inBatch > 0 {
		st.Batch = schemas.PlannerStepTurnID(tr.TurnID, st.Index)
	}
	key := schemas.PlannerStepKey(tr.TurnID, st.Index)
	if _, err := p.steps.Create(ctx, key, st); errors.Is(err, store.ErrExists) {
		stored, _, err := p.steps.Get(ctx, key)
		return stored, err
	} else if err != nil {
		return nil, err
	}
	p.cfg.Logger.Debug("model step recorded", "turn", tr.TurnID, "step", st.Index, "calls", len(st.Calls), "batch", st.Batch)
	return st, nil
}

// check is the planner's check of a tool call before it may join a batch:
// a function call, arguments that are a JSON object, a tool the catalog
// knows, arguments its schema accepts. Only permanent (coded) failures are
// returned: a tool that cannot be reached now is left to the executor's
// same check, which retries.
func (p *Planner) check(ctx context.Context, kind, tool, args string) error {
	if kind != "" && kind != "function" {
		return schemas.Errorf(schemas.CodeInvalidInput, "tool call of type %q: only function calls are supported", kind)
	}
	if schemas.IsGateTool(tool) {
		return schemas.Errorf(schemas.CodeToolNotFound, "no tool named %q for the model: the claude.* tools are the gates of Claude Code's hooks", tool)
	}
	canon, _, err := schemas.CanonicalArgs(args)
	if err != nil {
		if !schemas.Permanent(err) {
			return &schemas.Error{Code: schemas.CodeArgsInvalidJSON, Reason: err.Error(), Err: err}
		}
		return err
	}
	if _, _, err := p.cfg.Engine.Tools().Check(ctx, tool, canon); schemas.Permanent(err) {
		return err
	}
	return nil
}

// offer returns the tools offered to the model for a turn of context tc
// (every catalog tool the policy does not deny for its audience, but the
// gate tools of Claude Code's hooks, schemas.IsGateTool) and the
// tool name of each offered function name.
func (p *Planner) offer(ctx context.Context, tc *schemas.TurnContext) ([]openai.ChatCompletionToolUnionParam, map[string]string) {
	specs, err := p.cfg.Engine.Tools().List(ctx)
	if err != nil {
		p.cfg.Logger.Warn("planner: some tool providers could not list their tools; offering the others", "err", err)
	}
	var out []openai.ChatCompletionToolUnionParam
	names := map[string]string{}
	for _, s := range specs {
		if schemas.IsGateTool(s.Name) || p.cfg.Policy.ModeFor(s.Name, tc.Audience, s.Hints) == policy.ModeDeny {
			continue // a gate of Claude Code's hooks is never offered to a model, as MCP does not
		}
		tp, err := toolParam(s.Name, s.Description, s.InputSchema)
		if err != nil {
			p.cfg.Logger.Warn("planner: tool not offered", "tool", s.Name, "err", err)
			continue
		}
		out = append(out, tp)
		names[functionName(s.Name)] = s.Name
	}
	return out, names
}

// messages builds the chat of step len(earlier) of tr: system prompt,
// conversation, the turn's text, then each earlier step's answer and
// results.
func (p *Planner) messages(ctx context.Context, tr *schemas.PlannerTurn, earlier []*schemas.PlannerStep) ([]openai.ChatCompletionMessageParamUnion, error) {
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(p.cfg.SystemPrompt)}
	conv, _, err := p.convs.Get(ctx, schemas.ConversationKey(schemas.SessionKeyOf(tr.Context)))
	switch {
	case err == nil:
		for _, m := range p.truncate(conv.Messages) {
			if m.Role == "assistant" {
				msgs = append(msgs, openai.AssistantMessage(m.Text))
			} else {
				msgs = append(msgs, openai.UserMessage(m.Text))
			}
		}
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	msgs = append(msgs, openai.UserMessage(tr.Text))
	for _, s := range earlier {
		am := openai.ChatCompletionAssistantMessageParam{}
		if s.Text != "" {
			am.Content.OfString = openai.String(s.Text)
		}
		for _, c := range s.Calls {
			am.ToolCalls = append(am.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID: c.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: functionName(c.Tool), Arguments: c.Args},
				},
			})
		}
		msgs = append(msgs, openai.ChatCompletionMessageParamUnion{OfAssistant: &am})
		for _, c := range s.Calls {
			msgs = append(msgs, openai.ToolMessage(resultText(s, c), c.ID))
		}
	}
	return msgs, nil
}

// resultText is what the model reads as the result of call c of step s:
// the tool's output when it ran and succeeded, else a JSON object with the
// status, code and reason.
func resultText(s *schemas.PlannerStep, c schemas.PlannerCall) string {
	type failure struct {
		Status string `json:"status"`
		Code   string `json:"code,omitempty"`
		Reason string `json:"reason,omitempty"`
		Output string `json:"output,omitempty"`
	}
	var f failure
	switch {
	case c.Code != "":
		f = failure{Status: "error", Code: string(c.Code), Reason: "the call was not run: " + c.Reason}
	case c.BatchIndex < 0 || c.BatchIndex >= len(s.Results):
		f = failure{Status: "failed", Reason: "the call has no result"}
	default:
		r := s.Results[c.BatchIndex]
		if r.Status == schemas.ResultOK {
			if r.Output == "" {
				return "ok"
			}
			return r.Output
		}
		f = failure{Status: string(r.Status), Code: string(r.Code), Reason: r.Reason, Output: r.Output}
	}
	b, _ := json.Marshal(f)
	return string(b)
}

// truncate applies the conversation truncation rule: the oldest messages
// are dropped until at most History.MaxMessages remain with at most
// History.MaxBytes of text.
func (p *Planner) truncate(msgs []schemas.ConversationMessage) []schemas.ConversationMessage {
	size := 0
	for _, m := range msgs {
		size += len(m.Text)
	}
	for len(msgs) > 0 && (len(msgs) > p.cfg.History.MaxMessages || size > p.cfg.History.MaxBytes) {
		size -= len(msgs[0].Text)
		msgs = msgs[1:]
	}
	return msgs
}

// submit publishes the batch of step st on topology.StepSubject, from
// where ingest (and only ingest) publishes it on the session's accepted
// subject (ingest.HandleStep). The message ids and the executor's KV create
// of the batch make it one batch however often it is submitted.
func (p *Planner) submit(ctx context.Context, tr *schemas.PlannerTurn, st *schemas.PlannerStep) error {
	var calls []schemas.ToolCall
	for _, c := range st.Calls {
		if c.BatchIndex < 0 {
			continue
		}
		canon, digest, err := schemas.CanonicalArgs(c.Args)
		if err != nil {
			return err
		}
		calls = append(calls, schemas.ToolCall{CallID: schemas.CallID(st.Batch, c.BatchIndex), Index: c.BatchIndex, Tool: c.Tool, Args: canon, ArgsDigest: digest})
	}
	t := &schemas.AcceptedTurn{
		TurnID: st.Batch, Context: tr.Context, Text: fmt.Sprintf("step %d of %s", st.Index, tr.TurnID),
		Calls: calls, AcceptedAt: st.CreatedAt, Origin: tr.TurnID,
	}
	return bus.Publish(ctx, p.cfg.JS, topology.StepSubject(st.Batch), topology.StepMsgID(st.Batch), t)
}

// end ends the loop of turnID in state (completed with reply, or failed
// with code and reason), once, and finishes it. last is the final step.
func (p *Planner) end(ctx context.Context, turnID string, state schemas.PlannerState, code schemas.Code, text string, last *schemas.PlannerStep) error {
	ended := false
	tr, _, err := p.turns.Mutate(ctx, turnID, func(t *schemas.PlannerTurn) error {
		ended = false
		if t.State.Terminal() {
			return store.ErrSkip
		}
		ended = true
		t.State, t.Code, t.UpdatedAt = state, code, p.now()
		if state == schemas.PlannerCompleted {
			t.Reply = text
		} else {
			t.Reason = clip(text, 1024)
		}
		if last != nil && last.Index == t.Step {
			t.TokensIn += last.TokensIn
			t.TokensOut += last.TokensOut
		}
		return nil
	})
	if err != nil {
		return err
	}
	if ended {
		n := tr.Step
		if state == schemas.PlannerCompleted {
			n++
		}
		p.stepsPerTurn.Observe(float64(n))
		if code == schemas.CodeBudgetExhausted {
			p.exhausted.Inc()
		}
		p.cfg.Logger.Info("planner turn ended", "turn", turnID, "state", state, "code", code, "steps", n)
	}
	return p.finish(ctx, tr)
}

// finish does what follows the end of a loop, each part idempotent: the
// reply event (completed, verified context only) and the conversation,
// then the turn's terminal batch record, whose write keeps the turn's
// outcome (its log's outcome event), then the published outcome and the
// session's next loop. The reply is stored before the write that ends the
// turn, so that a reader merging the events with the turn logs' outcomes
// (transport/eventfeed) finds it among the turn's events stored before
// its outcome: a turn's reply comes before its outcome.
func (p *Planner) finish(ctx context.Context, tr *schemas.PlannerTurn) error {
	if tr.State == schemas.PlannerCompleted {
		if err := p.reply(ctx, tr); err != nil {
			return err
		}
		if err := p.remember(ctx, tr); err != nil {
			return err
		}
	}
	b, err := p.terminalBatch(ctx, tr)
	if errors.Is(err, batch.ErrNotItsTurn) {
		p.cfg.Logger.Info("planner turn ends in its turn: it waits for its session's earlier turn", "turn", tr.TurnID)
		return nil // its predecessor's end announces it, and Drive finishes it then
	}
	if err != nil {
		return err
	}
	// The steps leave with the turn (its terminal write carries the TTL).
	for i := 0; i <= tr.Step; i++ {
		if err := p.steps.Retire(ctx, schemas.PlannerStepKey(tr.TurnID, i)); err != nil {
			return err
		}
	}
	if err := p.cfg.Engine.Finish(ctx, b); err != nil { // releases the session
		return err
	}
	return p.legacyRelease(ctx, tr.SessionID, tr.TurnID)
}

// reply publishes the reply event of completed turn tr, unless the events
// stream holds it already. Its target and audience come only from the
// verified TurnContext; a turn whose context does not verify gets none.
func (p *Planner) reply(ctx context.Context, tr *schemas.PlannerTurn) error {
	if err := p.authorize(tr.Context, tr.TurnID); err != nil {
		p.cfg.Logger.Warn("planner reply withheld: the turn's context does not verify", "turn", tr.TurnID, "err", err)
		return nil
	}
	subj := topology.SubjectTurnReply + tr.TurnID
	s, err := p.cfg.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return err
	}
	if stored, err := bus.Stored(ctx, s, subj); err != nil || stored {
		return err
	}
	ev := &schemas.ReplyEvent{
		TurnID: tr.TurnID, SessionID: tr.SessionID, Text: tr.Reply,
		Reply:    schemas.ReplyTarget{Transport: tr.Context.Transport, Channel: tr.Context.Channel},
		Audience: tr.Context.Audience, Steps: tr.Step + 1, At: tr.UpdatedAt,
	}
	return bus.Publish(ctx, p.cfg.JS, subj, topology.ReplyMsgID(tr.TurnID), ev)
}

// remember appends tr's text and reply to its session's conversation, once,
// cut by the truncation rule.
func (p *Planner) remember(ctx context.Context, tr *schemas.PlannerTurn) error {
	key := schemas.ConversationKey(schemas.SessionKeyOf(tr.Context))
	for {
		c, rev, err := p.convs.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			c, err = &schemas.Conversation{SessionID: tr.SessionID}, nil
		}
		if err != nil {
			return err
		}
		if slices.ContainsFunc(c.Messages, func(m schemas.ConversationMessage) bool { return m.TurnID == tr.TurnID }) {
			return nil
		}
		c.Messages = p.truncate(append(c.Messages,
			schemas.ConversationMessage{Role: "user", Text: tr.Text, TurnID: tr.TurnID, At: tr.StartedAt},
			schemas.ConversationMessage{Role: "assistant", Text: tr.Reply, TurnID: tr.TurnID, At: tr.UpdatedAt}))
		c.UpdatedAt = p.now()
		if rev == 0 {
			_, err = p.convs.Create(ctx, key, c)
		} else {
			_, err = p.convs.Update(ctx, key, c, rev)
		}
		if errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrConflict) {
			continue
		}
		return err
	}
}

// endBatch writes the terminal batch record of planner turn tr and
// finishes it through the engine, which publishes the turn's one outcome
// (batch.Outcome) and passes the executor's session on.
func (p *Planner) endBatch(ctx context.Context, tr *schemas.PlannerTurn) error {
	b, err := p.terminalBatch(ctx, tr)
	if err != nil {
		return err
	}
	return p.cfg.Engine.Finish(ctx, b)
}

// terminalBatch makes the batch record of planner turn tr terminal (no
// calls: its calls ran in its step batches), once, and returns the record
// as stored. The record normally exists (planBatch); a turn failed closed
// before it was queued, or recorded by an earlier version, gets it by KV
// create.
func (p *Planner) terminalBatch(ctx context.Context, tr *schemas.PlannerTurn) (*schemas.BatchRecord, error) {
	state := schemas.BatchCompleted
	if tr.State == schemas.PlannerFailed {
		state = schemas.BatchFailed
	}
	for {
		b, rev, err := p.cfg.Store.Batches.Get(ctx, tr.TurnID)
		if errors.Is(err, store.ErrNotFound) && tr.OrderSeq != 0 {
			// A placed batch ends only in its turn: created queued first
			// (planBatch), and ended below once its turn has come.
			if _, _, err := p.planBatch(ctx, tr); err != nil {
				return nil, err
			}
			continue
		}
		if errors.Is(err, store.ErrNotFound) {
			now := p.now()
			rec := p.batchRecord(tr)
			rec.State, rec.Code, rec.Reason, rec.CreatedAt, rec.UpdatedAt = state, tr.Code, tr.Reason, now, now
			rec.Outcome = batch.Outcome(p.cfg.Engine.Keys(), rec) // created in the turn's log, ended
			if _, err := p.cfg.Store.Batches.Create(ctx, tr.TurnID, rec); errors.Is(err, store.ErrExists) {
				continue
			} else if err != nil {
				return nil, err
			}
			return rec, nil
		}
		if err != nil {
			return nil, err
		}
		if b.State.Terminal() {
			return b, nil
		}
		b, _, err = p.cfg.Store.Batches.MutateFrom(ctx, tr.TurnID, b, rev, func(b *schemas.BatchRecord) error {
			if b.State.Terminal() {
				return store.ErrSkip
			}
			if err := p.cfg.Engine.MayEnd(ctx, b); err != nil {
				return err // as batch.Engine.End: a placed batch ends only in its turn
			}
			b.State, b.Code, b.Reason, b.UpdatedAt = state, tr.Code, tr.Reason, p.now()
			if !b.Bucketed() {
				// As for every batch: the write that ends it keeps the
				// turn's outcome (its log's outcome event).
				b.Outcome = batch.Outcome(p.cfg.Engine.Keys(), b)
			}
			return nil
		})
		return b, err
	}
}

// batchRecord is the batch record of planner turn tr as planBatch creates
// it: queued, no calls of its own, Plan set, at the turn's place in its
// session's order.
func (p *Planner) batchRecord(tr *schemas.PlannerTurn) *schemas.BatchRecord {
	now := p.now()
	return &schemas.BatchRecord{
		TurnID: tr.TurnID, SessionID: tr.SessionID, Context: tr.Context, Text: tr.Text,
		Calls: []schemas.ToolCall{}, Approvals: []string{}, Results: []*schemas.ToolResult{},
		State: schemas.BatchQueued, Plan: true, CreatedAt: now, UpdatedAt: now,
		OrderSeq: tr.OrderSeq, OrderAfter: tr.OrderAfter,
	}
}

// start tries to start the loop of queued planner turn tr: its batch record
// exists (planBatch) and its turn has come (batch.Engine.ItsTurn: the
// batch before it in its session's order has ended). It reports whether the
// loop may run; if it must wait, it applies the session policy (supersede)
// and reports false: the end of the turn before it announces the turn on
// topology.PlanReadySubject. A turn without a place (one an earlier version
// recorded) takes the session record's queue instead, as it did then
// (sessionorder, batch.Engine.Acquire).
func (p *Planner) start(ctx context.Context, tr *schemas.PlannerTurn) (bool, error) {
	b, rev, err := p.planBatch(ctx, tr)
	if err != nil {
		return false, err
	}
	switch {
	case b.State.Terminal():
		return false, fmt.Errorf("planner turn %s is queued but its batch is %s", tr.TurnID, b.State)
	case b.State != schemas.BatchQueued:
		return true, nil // started before a crash: its turn had come
	}
	supersede := tr.Context != nil && p.cfg.Policy.Busy(tr.Context.Transport) == policy.BusySupersede
	if b.OrderSeq != 0 {
		its, err := p.cfg.Engine.ItsTurn(ctx, b)
		if err != nil {
			return false, err
		}
		if !its {
			p.cfg.Logger.Info("planner turn waits for its session's earlier turn", "turn", tr.TurnID, "after", b.OrderAfter)
			if supersede {
				return false, p.cfg.Engine.SupersedeBefore(ctx, b)
			}
			return false, nil
		}
	} else {
		// Only a turn of a legacy session (a context sealed before sessions
		// were scoped by transport) can share a session with a legacy loop
		// queue: a scoped session never existed when loops queued there.
		if tr.Context == nil || tr.Context.SessionKey == "" {
			if pass, err := p.legacyGate(ctx, tr.SessionID, tr.TurnID); err != nil || !pass {
				return false, err
			}
		}
		snap, err := p.order.Check(ctx, b)
		if err != nil {
			return false, err
		}
		active, err := p.cfg.Engine.Acquire(ctx, batch.SessionOf(tr.Context), tr.TurnID, sessionorder.ArrivalSeq(b), snap)
		if err != nil {
			return false, err
		}
		if !active {
			p.cfg.Logger.Info("planner turn queued behind its session's turn", "turn", tr.TurnID, "session", tr.SessionID)
			if supersede {
				return false, p.cfg.Engine.SupersedeActive(ctx, batch.SessionOf(tr.Context), tr.TurnID)
			}
			return false, nil
		}
	}
	if _, _, err := p.cfg.Store.Batches.MutateFrom(ctx, tr.TurnID, b, rev, func(b *schemas.BatchRecord) error {
		if b.State != schemas.BatchQueued {
			return store.ErrSkip
		}
		b.State, b.UpdatedAt = schemas.BatchRunning, p.now()
		return nil
	}); err != nil {
		return false, err
	}
	return true, nil
}

// planBatch returns the batch record of planner turn tr, creating it
// (queued, Plan) by KV create if it does not exist yet. The record exists
// before the turn joins its session's queue, as every queued turn's does
// (package sessionorder relies on it).
func (p *Planner) planBatch(ctx context.Context, tr *schemas.PlannerTurn) (*schemas.BatchRecord, uint64, error) {
	b, rev, err := p.cfg.Store.Batches.Get(ctx, tr.TurnID)
	if !errors.Is(err, store.ErrNotFound) {
		return b, rev, err
	}
	rec := p.batchRecord(tr)
	rev, err = p.cfg.Store.Batches.Create(ctx, tr.TurnID, rec)
	if errors.Is(err, store.ErrExists) {
		return p.cfg.Store.Batches.Get(ctx, tr.TurnID)
	}
	return rec, rev, err
}

// supersededBy returns the turn that superseded the loop of tr, if one did:
// marked on the loop's batch record (batch.Engine.SupersedeLoop), or on the
// planner turn by an earlier version.
func (p *Planner) supersededBy(ctx context.Context, tr *schemas.PlannerTurn) (string, error) {
	if tr.SupersededBy != "" {
		return tr.SupersededBy, nil
	}
	b, _, err := p.cfg.Store.Batches.Get(ctx, tr.TurnID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", nil
	case err != nil:
		return "", err
	}
	return b.SupersededBy, nil
}

// Loop queues of an earlier version.
//
// Before loops held their sessions' queue (schemas.SessionRecord, shared
// with the executor), the planner ordered a session's loops in a queue of
// its own, schemas.PlannerQueue. A loop that was running or queued there
// when the planner was upgraded still finishes through it: legacyGate keeps
// a new turn of the session behind such a loop, and legacyRelease (after
// every loop's end) hands that queue on as before. New loops never add to
// it, so it drains and empties.

// legacyGate reports whether turnID may go on to take its session's queue:
// yes when no legacy loop queue holds the session, or turnID is its active
// turn; otherwise turnID is queued in it (once), behind the loop that runs
// there, and is announced by legacyRelease when that loop ends.
func (p *Planner) legacyGate(ctx context.Context, sessionID, turnID string) (bool, error) {
	key := schemas.PlannerQueueKey(schemas.LegacySessionKey(sessionID))
	for {
		q, rev, err := p.queue.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		switch {
		case q.Active == turnID:
			return true, nil
		case q.Active == "" && len(q.Queue) == 0:
			return true, nil // drained
		case q.Active == "":
			q.Active = turnID
			q.Queue = slices.DeleteFunc(q.Queue, func(t string) bool { return t == turnID })
		case slices.Contains(q.Queue, turnID):
			return false, nil
		default:
			q.Queue = append(q.Queue, turnID)
		}
		q.UpdatedAt = p.now()
		if _, err := p.queue.Update(ctx, key, q, rev); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return false, err
		}
		return q.Active == turnID, nil
	}
}

// legacyRelease ends turnID's hold on its session's legacy loop queue, if it
// has one, and announces the next queued turn. If turnID no longer holds it (a repeated release), the
// active turn is announced again while it is still queued, so a crash
// between the two steps loses nothing.
func (p *Planner) legacyRelease(ctx context.Context, sessionID, turnID string) error {
	key := schemas.PlannerQueueKey(schemas.LegacySessionKey(sessionID))
	q, _, err := p.queue.Mutate(ctx, key, func(q *schemas.PlannerQueue) error {
		if q.Active != turnID {
			return store.ErrSkip
		}
		q.Active, q.UpdatedAt = "", p.now()
		if len(q.Queue) > 0 {
			q.Active, q.Queue = q.Queue[0], q.Queue[1:]
		}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	next := q.Active
	if next == "" || next == turnID {
		return nil
	}
	if nt, _, err := p.turns.Get(ctx, next); err != nil || nt.State != schemas.PlannerQueued {
		if errors.Is(err, store.ErrNotFound) {
			err = nil
		}
		return err
	}
	n := &schemas.TurnNotice{TurnID: next, SessionID: sessionID, Kind: schemas.NoticeReady, At: p.now()}
	return bus.Publish(ctx, p.cfg.JS, topology.PlanReadySubject(schemas.LegacySessionKey(sessionID)), topology.PlanReadyMsgID(next), n)
}
