package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// expirySweep says whether Tollgate expires an approval nobody answers (the
// approver's pending tracker does), so for DecideLate the
// harness just waits. Set it to false to exercise the late-decision path
// (APPROVAL_EXPIRED) instead.
const expirySweep = true

// transport is the transport the harness plays. Its policy rule makes its
// verified users interactive.
const transport = "chaos"

// The harness talks to Tollgate the way a transport and an approval UI do
// (docs/protocol.md §9): it publishes InboundMessage and Decision records
// with a plain NATS client and follows the events stream, instead of running
// the tollgate CLI once per message, which would cost a process start per
// turn and per decision (thousands per run) and could not keep several
// decisions for one approval in flight at the same moment.

// turnState is the harness's view of one planned turn.
type turnState struct {
	plan      *TurnPlan
	msgID     string
	id        string // turn id, derived from transport and msgID
	sessionID string
	sender    string
	done      chan struct{} // closed once the turn is seen terminal

	// guarded by driver.mu
	seq       uint64 // TOLLGATE_INBOUND sequence: the turn's arrival order
	published bool
	terminal  bool
	lastSeen  time.Time
	sent      []string // what became of each decision sent (driver.sent)
}

// driver publishes turns and decisions and follows their progress.
type driver struct {
	h     *harness
	js    jetstream.JetStream
	st    *store.Store
	turns []*turnState
	byID  map[string]*turnState // read-only once built
	// faultsDone is closed once every planned fault has been injected and
	// every worker is up again (or the drive is over); set before the
	// drive starts.
	faultsDone <-chan struct{}

	mu           sync.Mutex
	handled      map[string]bool // approvals whose decisions have been started
	rejections   map[schemas.Code]int
	unknown      int // events naming no planned turn
	published    int
	terminal     int
	lastProgress time.Time
	lastTerminal time.Time
	decisions    sync.WaitGroup
	grants       map[string][]string   // by session: the grants the harness's DecideGrant decisions make
	revocations  map[string]*sync.Once // by turn: its revocation (TurnPlan.Revoke)
}

func newDriver(h *harness, js jetstream.JetStream, st *store.Store) *driver {
	d := &driver{h: h, js: js, st: st, byID: map[string]*turnState{},
		handled: map[string]bool{}, rejections: map[schemas.Code]int{}, lastProgress: time.Now(),
		grants: map[string][]string{}, revocations: map[string]*sync.Once{}}
	for i := range h.plan.Turns {
		p := &h.plan.Turns[i]
		t := &turnState{
			plan:      p,
			msgID:     fmt.Sprintf("m-%d-%06d", h.cfg.Seed, p.Index),
			sessionID: fmt.Sprintf("chaos-%d-s%05d", h.cfg.Seed, p.Session),
			sender:    fmt.Sprintf("u%05d", p.Session),
			done:      make(chan struct{}),
		}
		t.id = schemas.TurnID(transport, t.msgID)
		d.turns = append(d.turns, t)
		d.byID[t.id] = t
	}
	return d
}

func (d *driver) counts() (published, terminal int, lastProgress, lastTerminal time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.published, d.terminal, d.lastProgress, d.lastTerminal
}

// sent notes what became of a decision sent for t: when t does not end,
// the report shows it (Run), the evidence of where the decision went.
func (d *driver) sent(t *turnState, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t.sent = append(t.sent, time.Now().UTC().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// unended returns, for each turn not seen terminal, what became of the
// decisions sent for it.
func (d *driver) unended() map[string][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string][]string{}
	for _, t := range d.turns {
		if t.published && !t.terminal {
			out[t.id] = slices.Clone(t.sent)
		}
	}
	return out
}

// answered describes the answer to a decision sent by request.
func answered(a submit.Answer) string {
	s := string(a.Result)
	if a.Code != "" {
		s += " " + string(a.Code)
	}
	return s + stored(a.Stored)
}

// stored describes a stream's acknowledgement of a decision ("" for none).
func stored(ack *jetstream.PubAck) string {
	if ack == nil {
		return ""
	}
	s := fmt.Sprintf(" stored %s seq %d", ack.Stream, ack.Sequence)
	if ack.Duplicate {
		s += " (a duplicate)"
	}
	return s
}

// publish stores data on subject with message id msgID, retrying (same id,
// so the stream stores it once) through disconnects and broker restarts
// until ctx ends.
func (d *driver) publish(ctx context.Context, subject, msgID string, data []byte) (*jetstream.PubAck, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, msgID)
		ack, err := d.js.PublishMsg(actx, m)
		cancel()
		if err == nil {
			return ack, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("publish %s (%s): %w", subject, msgID, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// inbound is the message of turn t.
func (d *driver) inbound(t *turnState) *schemas.InboundMessage {
	m := &schemas.InboundMessage{
		Transport: transport, MessageID: t.msgID, SessionID: t.sessionID,
		Sender:  schemas.Sender{ID: t.sender, Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-" + t.sender, Kind: schemas.ChannelDM},
		Text:    t.plan.Text(),
		SentAt:  time.Now().UTC(),
	}
	for i, c := range t.plan.Calls {
		args := fmt.Sprintf(`{"turn":%d,"call":%d}`, t.plan.Index, i)
		if c.Crash {
			args = fmt.Sprintf(`{"turn":%d,"call":%d,"crash":true}`, t.plan.Index, i)
		}
		m.Calls = append(m.Calls, schemas.ProposedCall{Tool: c.Tool, Args: args})
	}
	return m
}

// send publishes turn t's inbound message.
func (d *driver) send(ctx context.Context, t *turnState) error {
	m := d.inbound(t)
	data, err := schemas.Encode(m)
	if err != nil {
		return err
	}
	ack, err := d.publish(ctx, topology.InboundSubject(transport, m.SessionID), topology.InboundMsgID(transport, t.msgID), data)
	if err != nil {
		return err
	}
	now := time.Now()
	d.mu.Lock()
	t.seq, t.published, t.lastSeen = ack.Sequence, true, now
	d.published++
	d.lastProgress = now
	d.mu.Unlock()
	return nil
}

// markTerminal records that t reached a terminal state.
func (d *driver) markTerminal(t *turnState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t.terminal {
		return
	}
	now := time.Now()
	t.terminal = true
	d.terminal++
	d.lastProgress, d.lastTerminal = now, now
	close(t.done)
}

// runSession publishes one session's turns in order: a burst turn right
// after the previous one, any other once every earlier turn has ended. A
// turn with a crash call waits until every fault has been injected and
// every worker is up again.
func (d *driver) runSession(ctx context.Context, turns []int) error {
	var open []*turnState
	for j, i := range turns {
		t := d.turns[i]
		if j > 0 && !t.plan.Burst {
			if err := waitDone(ctx, open); err != nil {
				return err
			}
			open = open[:0]
		}
		if t.plan.crashes() {
			select {
			case <-d.faultsDone:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := d.send(ctx, t); err != nil {
			return err
		}
		open = append(open, t)
	}
	return waitDone(ctx, open)
}

func waitDone(ctx context.Context, ts []*turnState) error {
	for _, t := range ts {
		select {
		case <-t.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Event subjects the harness follows.
var followed = []string{
	topology.SubjectApprovalRequested + ">",
	topology.SubjectTurnOutcome + ">",
	topology.SubjectDecisionRejected + ">",
}

// follow consumes the followed events, and the turn logs' outcome and
// awaiting events (where this version keeps a turn's outcome and its
// requests), with ordered consumers
// (which the client recreates after a broker restart) until stop is
// called. The sweep covers anything they might still miss.
func (d *driver) follow(ctx context.Context) (stop func(), err error) {
	var ccs []jetstream.ConsumeContext
	stop = func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	consume := func(stream, filter string, fn func(jetstream.Msg)) error {
		cons, err := d.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			return fmt.Errorf("%s consumer: %w", stream, err)
		}
		cc, err := cons.Consume(fn, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			d.h.debugf("%s consumer: %v", stream, err)
		}))
		if err != nil {
			return fmt.Errorf("%s consume: %w", stream, err)
		}
		ccs = append(ccs, cc)
		return nil
	}
	for _, f := range followed {
		if err := consume(topology.StreamEvents, f, func(m jetstream.Msg) { d.onEvent(ctx, m) }); err != nil {
			stop()
			return nil, err
		}
	}
	logs, err := topology.OpenTurnLogs(ctx, d.js)
	if err != nil {
		stop()
		return nil, err
	}
	for i := range logs {
		if err := consume(topology.TurnLogStream(i), topology.TurnLogOutcomeFilter(i), d.onLoggedOutcome); err != nil {
			stop()
			return nil, err
		}
		if err := consume(topology.TurnLogStream(i), topology.TurnLogAwaitingFilter(i), func(m jetstream.Msg) { d.onLoggedRequests(ctx, m) }); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// onLoggedRequests decides the approvals that the move to awaiting m (a
// turn log's awaiting event) requested, as their published requests
// would be (onRequested takes each approval once, from either).
func (d *driver) onLoggedRequests(ctx context.Context, m jetstream.Msg) {
	turn := outcomes.Turn(m.Subject())
	reqs, err := store.DecodeRequested(turn, m.Data())
	if err != nil {
		d.h.logf("undecodable awaiting event on %s: %v", m.Subject(), err)
		return
	}
	for _, a := range reqs {
		d.onRequested(ctx, a)
	}
}

// onLoggedOutcome ends the turn whose log's outcome event m is.
func (d *driver) onLoggedOutcome(m jetstream.Msg) {
	turn := outcomes.Turn(m.Subject())
	o, err := store.DecodeOutcome(turn, m.Data())
	switch {
	case errors.Is(err, store.ErrNoOutcome):
		return // the published copy ends it
	case err != nil:
		d.h.logf("undecodable outcome event on %s: %v", m.Subject(), err)
		return
	}
	d.ended(o)
}

// ended marks the turn of outcome o ended, from whichever copy comes
// first.
func (d *driver) ended(o *schemas.TurnOutcome) {
	if _, _, step := schemas.PlannerStepOf(o.TurnID); step {
		return // a planner turn's step batch: the turn ends with its own outcome
	}
	if t := d.turn(o.TurnID); t != nil {
		d.markTerminal(t)
	}
}

func (d *driver) onEvent(ctx context.Context, m jetstream.Msg) {
	route, rec, err := topology.Read(m.Subject(), m.Data(), topology.RouteApprovalRequested, topology.RouteTurnOutcome, topology.RouteDecisionRejected)
	if err != nil {
		if !errors.Is(err, topology.ErrUnrouted) {
			d.h.logf("undecodable %s event on %s: %v", route, m.Subject(), err)
		}
		return
	}
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		d.onRequested(ctx, rec)
	case *schemas.TurnOutcome:
		d.ended(rec)
	case *schemas.DecisionRejected:
		d.mu.Lock()
		d.rejections[rec.Code]++
		d.mu.Unlock()
	}
}

func (d *driver) turn(id string) *turnState {
	t := d.byID[id]
	if t == nil {
		d.mu.Lock()
		d.unknown++
		d.mu.Unlock()
	}
	return t
}

// batchOf returns the planned turn and calls of batch turnID: a turn's
// own, or a planner turn's step batch (schemas.PlannerStepTurnID), with
// key, the prefix of its calls' decision ids ("" or "p<step>-").
func (d *driver) batchOf(turnID string) (t *turnState, calls []CallPlan, key string) {
	if root, n, ok := schemas.PlannerStepOf(turnID); ok {
		if t = d.turn(root); t == nil || n >= len(t.plan.Steps) {
			return nil, nil, ""
		}
		return t, t.plan.Steps[n], fmt.Sprintf("p%d-", n)
	}
	if t = d.turn(turnID); t == nil {
		return nil, nil, ""
	}
	return t, t.plan.Calls, ""
}

// onRequested starts the planned decisions of a pending approval, once.
func (d *driver) onRequested(ctx context.Context, rec *schemas.ApprovalRecord) {
	t, calls, key := d.batchOf(rec.TurnID)
	if t == nil || rec.Status != schemas.ApprovalPending {
		return
	}
	i, err := planCall(*t.plan, calls, rec)
	if err != nil {
		d.h.logf("approval %s of batch %s (plan %d): %v", rec.ApprovalID, rec.TurnID, t.plan.Index, err)
		return
	}
	d.mu.Lock()
	t.lastSeen = time.Now()
	seen := d.handled[rec.ApprovalID]
	d.handled[rec.ApprovalID] = true
	d.mu.Unlock()
	if seen {
		return
	}
	d.decisions.Add(1)
	go func() {
		defer d.decisions.Done()
		if err := d.decide(ctx, t, calls[i], key+strconv.Itoa(i), rec); err != nil && ctx.Err() == nil {
			d.h.logf("decisions for %s: %v", rec.ApprovalID, err)
		}
	}()
}

// planCall returns the index in calls (batchOf's) of the planned call that
// approval rec is for: the call's index in its batch, or for a planner
// turn's step batch the planned call its arguments name
// (TurnPlan.StepCall), since a step batch leaves out the calls the
// planner refused.
func planCall(plan TurnPlan, calls []CallPlan, rec *schemas.ApprovalRecord) (int, error) {
	i, err := callIndex(rec.CallID)
	if err != nil || rec.ApprovalID != schemas.ApprovalID(rec.TurnID, i) {
		return 0, fmt.Errorf("call %q is not the approval's", rec.CallID)
	}
	if _, n, step := schemas.PlannerStepOf(rec.TurnID); step {
		p, ok := plan.StepCall(n, rec.Args)
		if !ok {
			return 0, fmt.Errorf("arguments %s name no call of step %d", rec.Args, n)
		}
		i = p
	}
	if i >= len(calls) {
		return 0, fmt.Errorf("call %d is not planned", i)
	}
	return i, nil
}

func callIndex(callID string) (int, error) {
	return strconv.Atoi(callID[strings.LastIndexByte(callID, '-')+1:])
}

// decide sends the decisions planned for call c of t, whose key names it
// in the decision ids ("<call index>", or "p<step>-<call index>" for a
// planner turn's step batch). Decision ids are derived from the plan, so
// sending them again is deduplicated.
func (d *driver) decide(ctx context.Context, t *turnState, c CallPlan, key string, rec *schemas.ApprovalRecord) error {
	id := func(k string) string { return fmt.Sprintf("d-%d-%06d-%s-%s", d.h.cfg.Seed, t.plan.Index, key, k) }
	one := func(option, decisionID string) error {
		dec := &schemas.Decision{
			DecisionID: decisionID, ApprovalID: rec.ApprovalID, Transport: transport,
			Decider: schemas.Sender{ID: t.sender, Kind: schemas.SenderUser, Verified: true},
			Option:  option, ArgsDigest: rec.ArgsDigest, SentAt: time.Now().UTC(),
		}
		// Odd turns send their decisions to the approver as requests
		// (pipeline/submit: what Tollgate's own surfaces do; stored on the
		// stream when no approver answers), the others store them on the
		// decision stream: both ways meet every fault.
		if t.plan.Index%2 == 1 {
			a, err := submit.Decision(ctx, d.js, dec)
			if err == nil {
				d.sent(t, "%s by request: %s", decisionID, answered(a))
				return nil
			}
			// Neither answered nor stored (the broker restarting): stored
			// below, retried until it is, as every decision here is.
			d.sent(t, "%s by request: %v", decisionID, err)
		}
		data, err := schemas.Encode(dec)
		if err != nil {
			return err
		}
		ack, err := d.publish(ctx, topology.DecisionSubject(transport, rec.ApprovalID), decisionID, data)
		if err != nil {
			d.sent(t, "%s on the stream: %v", decisionID, err)
		} else {
			d.sent(t, "%s on the stream:%s", decisionID, stored(ack))
		}
		return err
	}
	// all sends its decisions at the same moment.
	all := func(ds ...[2]string) error {
		errs := make([]error, len(ds))
		var wg sync.WaitGroup
		for k, x := range ds {
			wg.Go(func() { errs[k] = one(x[0], x[1]) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if t.plan.Revoke && c.Tool == toolsvc.LedgerGuarded {
		if err := d.revokeGrants(ctx, t); err != nil {
			return err
		}
	}
	const approve, deny = schemas.OptionApprove, schemas.OptionDeny
	switch p := c.Decision; p {
	case DecideGrant:
		gid := schemas.GrantID(rec.ApprovalID, id("g"))
		d.mu.Lock()
		if !slices.Contains(d.grants[t.sessionID], gid) {
			d.grants[t.sessionID] = append(d.grants[t.sessionID], gid)
		}
		d.mu.Unlock()
		return one(GrantOption, id("g"))
	case DecideApprove:
		return one(approve, id("a"))
	case DecideDeny:
		return one(deny, id("d"))
	case DecideApproveDup:
		return all([2]string{approve, id("a1")}, [2]string{approve, id("a1")}, [2]string{approve, id("a2")})
	case DecideDenyDup:
		return all([2]string{deny, id("d1")}, [2]string{deny, id("d1")}, [2]string{deny, id("d2")})
	case DecideConflict:
		if err := all([2]string{approve, id("a1")}, [2]string{deny, id("d1")}); err != nil {
			return err
		}
		return one(approve, id("a2"))
	case DecideLate:
		if expirySweep {
			return nil // Tollgate expires it by itself
		}
		// Decide just after the deadline (the approver compares with its own
		// clock; same machine).
		wait := time.Until(rec.ExpiresAt) + 300*time.Millisecond
		if rec.ExpiresAt.IsZero() {
			return fmt.Errorf("approval %s of %s has no expiry", rec.ApprovalID, rec.Tool)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		return one(approve, id("late"))
	default:
		return fmt.Errorf("call %s of turn %d needs no approval (plan %q) but one was requested", key, t.plan.Index, p)
	}
}

// revokeGrants revokes, once for turn t (the calls of t that wait for it
// block until it is done), every grant t's session made so far, through
// grants.Revoke (the path of `tollgate grants revoke`), retrying through
// broker restarts. A grant not made (its decision lost a race) is
// skipped.
func (d *driver) revokeGrants(ctx context.Context, t *turnState) error {
	d.mu.Lock()
	once := d.revocations[t.id]
	if once == nil {
		once = &sync.Once{}
		d.revocations[t.id] = once
	}
	ids := slices.Clone(d.grants[t.sessionID])
	d.mu.Unlock()
	var err error
	once.Do(func() {
		for _, id := range ids {
			for {
				rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, _, e := grants.Revoke(rctx, d.js, d.st, id, "chaos:harness", fmt.Sprintf("chaos turn %d", t.plan.Index), time.Now())
				cancel()
				if e == nil || errors.Is(e, store.ErrNotFound) {
					break
				}
				select {
				case <-ctx.Done():
					err = fmt.Errorf("revoke %s: %w", id, e)
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	})
	return err
}

// sweep is the fallback for events the harness missed: every second, each
// published turn that has shown no progress for a few seconds is looked up
// in KV; a terminal batch marks it terminal, and a pending approval the
// harness has not answered yet gets its decisions.
func (d *driver) sweep(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var idle []*turnState
		now := time.Now()
		d.mu.Lock()
		for _, t := range d.turns {
			if t.published && !t.terminal && now.Sub(t.lastSeen) > 4*time.Second {
				t.lastSeen = now
				idle = append(idle, t)
			}
		}
		d.mu.Unlock()
		for _, t := range idle {
			if err := d.check(ctx, t); err != nil {
				break // the broker is away (or the drive over): next round
			}
		}
	}
}

// check looks up one turn; it fails only when KV cannot be read.
func (d *driver) check(ctx context.Context, t *turnState) error {
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b, _, err := d.st.Batches.Get(gctx, t.id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil // not created yet
	case err != nil:
		return err
	case b.State.Terminal():
		// A terminal batch is a finished turn only once its outcome is
		// stored: a stage killed between the batch's terminal write and
		// the outcome's publish leaves it to the redelivery of its
		// trigger, up to an AckWait later. Ending the drive before then
		// would count the turn lost (it happened: TestChaosShort seed
		// 544263131).
		// The write that ends a batch of this version keeps the outcome
		// (its log's outcome event): that is the outcome stored.
		stored := b.Outcome != nil
		if !stored {
			if stored, err = d.outcomeStored(gctx, t.id); err != nil {
				return err
			}
		}
		if stored {
			d.markTerminal(t)
		}
		return nil
	}
	batches := map[string][]CallPlan{t.id: t.plan.Calls}
	for n, calls := range t.plan.Steps {
		batches[schemas.PlannerStepTurnID(t.id, n)] = calls
	}
	for id, calls := range batches {
		_, _, step := schemas.PlannerStepOf(id)
		for i, c := range calls {
			if !c.NeedsApproval() && !step {
				continue // a step batch's call i may be another planned call (planCall)
			}
			a, _, err := d.st.Approvals.Get(gctx, schemas.ApprovalID(id, i))
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				return err
			case a.Status == schemas.ApprovalPending:
				d.onRequested(ctx, a)
			}
		}
	}
	return nil
}

// outcomeStored reports whether the events stream holds an outcome of
// turnID.
func (d *driver) outcomeStored(ctx context.Context, turnID string) (bool, error) {
	s, err := d.js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return false, err
	}
	return bus.Stored(ctx, s, topology.EventSubject(topology.SubjectTurnOutcome, turnID))
}
