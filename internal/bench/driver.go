package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// path is the kind of turn a driver sends.
type path int

const (
	// fastPath: one echo call, which the built-in policy runs at once.
	fastPath path = iota
	// approvalPath: an echo call (runs at once) and a write_file call
	// (needs approval), so every batch has one allowed and one approved
	// call.
	approvalPath
	// pendingPath: one write_file call, left waiting (footprint).
	pendingPath
	// toolServicePath: the approval path with the approved call's work
	// (write_file's) done by a NATS tool service: an echo call and a
	// benchTool call (needs approval, as any tool the policy does not
	// name).
	toolServicePath
	// gatewayPath: the approval path's turn submitted and decided over
	// the HTTP gateway (httpGateway) instead of NATS.
	gatewayPath
	// plannerPath: a text-only turn (plannerText) that the planner stage
	// drives against the bench's scripted model (benchModel): one echo
	// call (the fast path's call, run at once), then the final answer.
	plannerPath
)

// plannerText is the text of the planner path's turns, the conversation
// the scripted model answers.
const plannerText = "bench: echo something, then answer"

func (p path) String() string {
	return [...]string{"fast", "approval", "pending", "approval via tool service", "approval over HTTP", "planner (echo, then the answer)"}[p]
}

// profileName names p's profile files in the profile phase.
func (p path) profileName() string {
	switch p {
	case gatewayPath:
		return "gateway"
	case plannerPath:
		return "planner"
	case toolServicePath:
		return "toolservice"
	}
	return p.String()
}

// approvalIndex is the index of the call that needs approval.
func (p path) approvalIndex() int {
	if p == pendingPath {
		return 0
	}
	return 1
}

// calls are the proposed calls of p's n-th turn.
func (p path) calls(n int64) []schemas.ProposedCall {
	calls := []schemas.ProposedCall{{Tool: "echo", Args: `{"text":"hi"}`}}
	write := schemas.ProposedCall{Tool: "write_file", Args: fmt.Sprintf(`{"content":"x","path":"bench/%d.txt"}`, n%64)}
	switch p {
	case approvalPath, gatewayPath:
		calls = append(calls, write)
	case pendingPath:
		calls = []schemas.ProposedCall{write}
	case toolServicePath:
		write.Tool = benchTool
		calls = append(calls, write)
	case plannerPath:
		calls = nil // the model chooses them
	}
	return calls
}

// decided reports whether the driver approves p's approval requests.
func (p path) decided() bool { return p == approvalPath || p == toolServicePath }

// Headers the driver adds for the raw stages only (they read ids from
// headers instead of decoding the message). Tollgate's stages never see them.
const (
	hdrTurn    = "Bench-Turn"
	hdrSession = "Bench-Session"
	// The layout phase's two designs (rawseq.go): the fact a raw stage's
	// write makes durable, and a turn's predecessor in its session.
	hdrFact = "Bench-Fact"
	hdrPred = "Bench-Pred"
)

// driver plays the transport (publishes inbound messages and waits for each
// turn's outcome) and, when decide is set, an automated decider that
// approves each request as soon as its approval-requested event is
// published. It observes outcomes and requests with core subscriptions on
// its own connection, so what it measures is what a transport sees.
type driver struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	run  string // prefix of message and decision ids, unique per run
	path path
	raw  bool // add the raw stages' headers
	// decide: approve requests as they are published.
	decide bool
	// streamDecisions: decisions are published on TOLLGATE_DECISIONS, as
	// the layout phase's two designs were measured, instead of sent to
	// the approver's service (pipeline/submit) as Tollgate's transports
	// send them.
	streamDecisions bool

	seq       atomic.Int64
	mu        sync.Mutex
	turns     map[string]*turn // turn id -> in flight
	decisions chan string      // approval ids to decide
	decWG     sync.WaitGroup
	subs      []*nats.Subscription
	// inOrder, on the planner path, carries every subscription's messages
	// to one goroutine, in the order the connection read them (handlers
	// by subscription): a planner turn's moments (its order entry, its
	// step batch accepted, the step's outcome) then reach it before the
	// turn's own outcome, which the server routed after them. Separate
	// async subscriptions each have a goroutine of their own, and under
	// load one ran the turn's end before another marked its step.
	inOrder    chan *nats.Msg
	handlersMu sync.Mutex
	handlers   map[*nats.Subscription]nats.MsgHandler
	dispatched chan struct{}
	pubErrs    atomic.Int64
	requested  atomic.Int64
	outcomes   atomic.Int64
	// watchBatches: sampleLatency watches the batch writes (onTurnLog).
	watchBatches atomic.Bool

	// latency sampling (nil: off)
	lat *latencies
}

// turn is one turn in flight.
type turn struct {
	id        string
	sent      time.Time
	requested time.Time // approval-requested event seen (approval path)
	decided   time.Time // decision published (approval path)
	startedAt time.Time // approved call's claim seen created
	finished  bool      // approved call's result seen written in its claim
	// Planner path: the turn seen published for the planner, its first
	// step's batch seen on the accepted subject (where the executor takes
	// it), that batch's outcome seen.
	planned, scheduled, stepDone time.Time
	done                         chan struct{}
	doneAt                       time.Time
}

// latencies collects the driver's latency samples of turns sent after from.
type latencies struct {
	mu       sync.Mutex
	from     time.Time
	outcome  []time.Duration // inbound published -> outcome
	decision []time.Duration // decision published -> approved call's claim created
	finished []time.Duration // decision published -> approved call's result written in its claim
	call     []time.Duration // approved call's claim created -> its result written
}

func newDriver(nc *nats.Conn, js jetstream.JetStream, run string, p path, raw, decide, streamDecisions bool) (*driver, error) {
	d := &driver{nc: nc, js: js, run: run, path: p, raw: raw, decide: decide, streamDecisions: streamDecisions,
		turns: map[string]*turn{}, decisions: make(chan string, 1<<16)}
	if p == plannerPath {
		d.inOrder, d.handlers, d.dispatched = make(chan *nats.Msg, 1<<18), map[*nats.Subscription]nats.MsgHandler{}, make(chan struct{})
		go func() {
			defer close(d.dispatched)
			for m := range d.inOrder {
				d.handlersMu.Lock()
				fn := d.handlers[m.Sub]
				d.handlersMu.Unlock()
				if fn != nil {
					fn(m)
				}
			}
		}()
	}
	sub := func(subj string, fn nats.MsgHandler) error {
		if d.inOrder != nil {
			d.handlersMu.Lock() // held until fn is registered: the dispatcher waits for it
			defer d.handlersMu.Unlock()
			s, err := nc.ChanSubscribe(subj, d.inOrder)
			if err != nil {
				return err
			}
			d.handlers[s] = fn
			d.subs = append(d.subs, s)
			return nil
		}
		s, err := nc.Subscribe(subj, fn)
		if err != nil {
			return err
		}
		// Never drop an event: a dropped outcome would look like a lost turn.
		if err := s.SetPendingLimits(-1, -1); err != nil {
			return err
		}
		d.subs = append(d.subs, s)
		return nil
	}
	// A turn's outcome: its log's outcome event (the write that ends it),
	// or the published copy (a version that publishes, or one before the
	// turn logs kept it); the first seen ends the turn.
	if err := sub(topology.SubjectTurnOutcome+"*", d.onOutcome); err != nil {
		return nil, err
	}
	// One subscription to the turn logs: a turn's writes arrive in order,
	// so its latency samples (onBatch) are taken before its outcome event
	// ends it, and its approval request (the move to awaiting keeps it)
	// before its decision.
	if err := sub(topology.SubjectTurnLogPrefix+"*.*.*", d.onTurnLog); err != nil {
		return nil, err
	}
	if p == plannerPath {
		if err := sub(topology.OrderFilter(topology.OrderPlan), d.onPlanned); err != nil {
			return nil, err
		}
		if err := sub(topology.SubjectTurnAccepted+">", d.onStepAccepted); err != nil {
			return nil, err
		}
	}
	if decide {
		// A few publishers, so that a decision never waits behind another's
		// encoding.
		for range 2 {
			d.decWG.Add(1)
			go d.decider()
		}
	}
	return d, nc.Flush()
}

// sampleLatency starts recording latencies of turns sent from now on. With
// decisions, it also watches the batch records to time decision ->
// approved call started and finished: their writes, wherever the stages
// keep them (each an append to the turn's log; an earlier version's in
// the batches bucket).
func (d *driver) sampleLatency() error {
	d.mu.Lock()
	d.lat = &latencies{from: time.Now()}
	d.mu.Unlock()
	if !d.path.decided() {
		return nil
	}
	d.watchBatches.Store(true) // the turn logs' writes: onTurnLog
	s, err := d.nc.Subscribe("$KV."+topology.BucketBatches+".*", d.onBatch)
	if err != nil {
		return err
	}
	_ = s.SetPendingLimits(-1, -1)
	d.subs = append(d.subs, s)
	return d.nc.Flush()
}

// batchTurn is the turn whose batch record a write on subject writes: the
// turn token of a turn log's subject (tollgate.turnlog.<p>.<turn>.<event>),
// or a batches bucket key's.
func batchTurn(subject string) string {
	if rest, ok := strings.CutPrefix(subject, topology.SubjectTurnLogPrefix); ok {
		if tok := strings.Split(rest, "."); len(tok) == 3 {
			return tok[1]
		}
		return ""
	}
	return lastToken(subject)
}

func (d *driver) close() {
	for _, s := range d.subs {
		_ = s.Unsubscribe()
	}
	if d.inOrder != nil {
		close(d.inOrder)
		<-d.dispatched
	}
	close(d.decisions)
	d.decWG.Wait()
}

func lastToken(s string) string { return s[strings.LastIndexByte(s, '.')+1:] }

func (d *driver) onOutcome(m *nats.Msg) { d.outcome(lastToken(m.Subject)) }

// onTurnLog takes a turn log's write: a latency sample while batches are
// watched (sampleLatency), and, for the outcome event (the write that
// ended the turn, whatever its record holds), the turn's end.
func (d *driver) onTurnLog(m *nats.Msg) {
	if d.watchBatches.Load() {
		d.onBatch(m)
	}
	switch _, turn, event, ok := topology.ParseTurnLogSubject(m.Subject); {
	case !ok:
	case event == topology.EventTurnOutcome:
		d.outcome(turn)
	case event == topology.EventTurnAwaiting:
		// The move to awaiting keeps the approval it requested: the
		// request, as an approval.requested event announced it before.
		d.requestedTurn(turn)
	}
}

// watchFacts also subscribes to subjects, where the layout phase's two
// designs make a turn's outcome and approval request durable (rawseq.go):
// a message whose Bench-Fact header is outcome or requested counts as
// the event of the turn its Bench-Turn header names.
func (d *driver) watchFacts(subjects []string) error {
	for _, subj := range subjects {
		s, err := d.nc.Subscribe(subj, func(m *nats.Msg) {
			switch m.Header.Get(hdrFact) {
			case factOutcome:
				d.outcome(m.Header.Get(hdrTurn))
			case factRequested:
				d.requestedTurn(m.Header.Get(hdrTurn))
			}
		})
		if err != nil {
			return err
		}
		if err := s.SetPendingLimits(-1, -1); err != nil {
			return err
		}
		d.subs = append(d.subs, s)
	}
	return d.nc.Flush()
}

// outcome ends turn id (an outcome seen); a later copy of it counts
// nothing.
func (d *driver) outcome(id string) {
	now := time.Now()
	if root, step, ok := schemas.PlannerStepOf(id); ok && d.path == plannerPath {
		if step == 0 {
			d.mark(root, now, func(t *turn) *time.Time { return &t.stepDone })
		}
		return
	}
	d.mu.Lock()
	t := d.turns[id]
	if t != nil {
		delete(d.turns, id)
		t.doneAt = now
		if l := d.lat; l != nil && !t.sent.Before(l.from) {
			l.mu.Lock()
			l.outcome = append(l.outcome, now.Sub(t.sent))
			l.mu.Unlock()
		}
	}
	d.mu.Unlock()
	if t != nil { // the first copy seen of a turn this driver sent
		d.outcomes.Add(1)
		close(t.done)
	}
}

// onPlanned times a planner turn's append to its session's order, for
// the planner (its message id is topology.OrderMsgID of the turn).
func (d *driver) onPlanned(m *nats.Msg) {
	if id, _, ok := topology.ParseOrderMsgID(headerOf(m, jetstream.MsgIDHeader)); ok {
		d.mark(id, time.Now(), func(t *turn) *time.Time { return &t.planned })
	}
}

// onStepAccepted times a planner turn's first step batch as it reaches
// the accepted subject, where the executor takes it: whoever put it there
// (ingest, or the server firing a message schedule), the time it took is
// the planner's side of the step, not the batch's.
func (d *driver) onStepAccepted(m *nats.Msg) {
	t, err := schemas.Decode[schemas.AcceptedTurn](m.Data)
	if err != nil {
		return
	}
	if root, step, ok := schemas.PlannerStepOf(t.TurnID); ok && step == 0 {
		d.mark(root, time.Now(), func(t *turn) *time.Time { return &t.scheduled })
	}
}

// mark sets the moment field(t) of turn id, if in flight, to at (the
// first time only).
func (d *driver) mark(id string, at time.Time, field func(*turn) *time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.turns[id]; t != nil && field(t).IsZero() {
		*field(t) = at
	}
}

// requestedTurn notes turnID's approval request and, when the driver
// decides, queues its decision: once per turn it sent and has not seen
// end, whichever of the places that keep the request (a turn log's
// awaiting event, a layout's fact: watchFacts) it hears first. Each place
// is heard on a subscription of its own, so the second copy can arrive
// after the turn's outcome: it counts nothing and decides nothing (a
// second decision would be a write the turn's sequence does not have).
func (d *driver) requestedTurn(turnID string) {
	now := time.Now()
	d.mu.Lock()
	t := d.turns[turnID]
	if t == nil || !t.requested.IsZero() {
		d.mu.Unlock()
		return
	}
	t.requested = now
	d.mu.Unlock()
	d.requested.Add(1)
	if d.decide {
		d.decisions <- schemas.ApprovalID(turnID, d.path.approvalIndex())
	}
}

// onBatch times decision -> approved call started and finished: the
// approved call is claimed in its batch record by the write that starts
// the batch, immediately before the tool runs, and its result is written
// by the write that completes the batch, immediately after it returns.
func (d *driver) onBatch(m *nats.Msg) {
	now := time.Now()
	turnID := batchTurn(m.Subject)
	d.mu.Lock()
	t, l := d.turns[turnID], d.lat
	tracked := t != nil && l != nil && !t.decided.IsZero() && !t.sent.Before(l.from)
	d.mu.Unlock()
	if !tracked {
		return
	}
	b, err := schemas.DecodeBatch(m.Data)
	if err != nil {
		return
	}
	i := d.path.approvalIndex()
	claimed, done := b.ClaimOf(i) != nil, i < len(b.Results) && b.Results[i] != nil
	d.mu.Lock()
	defer d.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if claimed && t.startedAt.IsZero() {
		t.startedAt = now
		l.decision = append(l.decision, now.Sub(t.decided))
	}
	if done && !t.startedAt.IsZero() && !t.finished && now.After(t.startedAt) {
		t.finished = true
		l.finished = append(l.finished, now.Sub(t.decided))
		l.call = append(l.call, now.Sub(t.startedAt))
	}
}

// decider sends an approval for each approval id it receives: published
// asynchronously (streamDecisions), or as a request to the approver's
// service, each in a goroutine of its own (at most one per turn in
// flight), as a transport's decision waits for its answer.
func (d *driver) decider() {
	defer d.decWG.Done()
	for id := range d.decisions {
		if d.streamDecisions {
			d.sendDecision(id)
			continue
		}
		d.decWG.Add(1)
		go func() {
			defer d.decWG.Done()
			d.sendDecision(id)
		}()
	}
}

// decisionTimeout bounds one decision request (submit.Decision stores a
// decision no approver answered on the stream).
const decisionTimeout = 30 * time.Second

// sendDecision approves approvalID as cli:alice: a request to the
// approver's service, answered once it is applied (submit.Decision), or,
// with streamDecisions, a publish on TOLLGATE_DECISIONS that returns at
// once. A decision that is not applied (a rejection, or stored on the
// stream because no approver answered) counts as a publish error.
func (d *driver) sendDecision(approvalID string) {
	dec := &schemas.Decision{
		DecisionID: d.run + "-d-" + strconv.FormatInt(d.seq.Add(1), 10), ApprovalID: approvalID, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
		Option:  schemas.OptionApprove, SentAt: time.Now().UTC(),
	}
	turnID := schemas.TurnIDOfApproval(approvalID)
	d.mu.Lock()
	if t := d.turns[turnID]; t != nil {
		t.decided = time.Now()
	}
	d.mu.Unlock()
	if !d.streamDecisions {
		ctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
		defer cancel()
		if a, err := submit.Decision(ctx, d.js, dec); err != nil || a.Result != submit.Applied {
			d.pubErrs.Add(1)
		}
		return
	}
	data, err := schemas.Encode(dec)
	if err != nil {
		d.pubErrs.Add(1)
		return
	}
	d.publish(&nats.Msg{Subject: topology.DecisionSubject("cli", approvalID), Data: data, Header: nats.Header{}}, dec.DecisionID)
}

// publish publishes m asynchronously with message id msgID, waiting for
// room in the window when it is full.
func (d *driver) publish(m *nats.Msg, msgID string) {
	for attempt := 0; ; attempt++ {
		_, err := d.js.PublishMsgAsync(m, jetstream.WithMsgID(msgID))
		if err == nil {
			return
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || attempt > 100 {
			d.pubErrs.Add(1)
			return
		}
	}
}

// inbound builds the inbound message of a new turn in session.
func (d *driver) inbound(session string) (msgID, turnID string, data []byte, err error) {
	n := d.seq.Add(1)
	messageID := d.run + "-m-" + strconv.FormatInt(n, 10)
	m := &schemas.InboundMessage{
		Transport: "cli", MessageID: messageID, SessionID: session,
		Sender:  schemas.Sender{ID: "alice", Display: "alice", Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
		Text:    "please", Calls: d.path.calls(n), SentAt: time.Now().UTC(),
	}
	if d.path == plannerPath {
		m.Text = plannerText
	}
	data, err = schemas.Encode(m)
	return topology.InboundMsgID("cli", messageID), schemas.TurnID("cli", messageID), data, err
}

// send publishes a new turn of session and returns it.
func (d *driver) send(session string) (*turn, error) {
	msgID, turnID, data, err := d.inbound(session)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: topology.InboundSubject("cli", session), Data: data, Header: nats.Header{}}
	if d.raw {
		m.Header.Set(hdrTurn, turnID)
		m.Header.Set(hdrSession, schemas.SessionKey("cli", session))
	}
	t := &turn{id: turnID, done: make(chan struct{})}
	d.mu.Lock()
	t.sent = time.Now()
	d.turns[turnID] = t
	d.mu.Unlock()
	d.publish(m, msgID)
	return t, nil
}

// turnTimeout is how long a closed-loop slot waits for one outcome before
// it counts the turn as timed out and moves on.
const turnTimeout = 30 * time.Second

// errTurnTimeout: a turn did not end within turnTimeout.
var errTurnTimeout = errors.New("no outcome within the turn timeout")

// turnTimes are the moments of one closed-loop turn, as its transport saw
// them: sent, its approval seen requested (pending), the decision sent,
// its outcome seen. Zero where the path has no such moment.
//
// They are instants, not time.Time values: the closed loops keep every
// turn's times until the report is written, and the all-in-one stages
// and the embedded server share this process's heap. A time.Time holds a
// pointer (its location), so a slice of them is memory every garbage
// collection scans. Kept as time.Time, the throughput phase's turns made
// each collection of the open loop after it mark for about 1.6x the CPU,
// and the open loop's latency stalls are those collections (docs/bench.md,
// "The open loop's stalls are garbage collections").
type turnTimes struct {
	sent, pending, decided, done instant
	// Planner path: see turn.
	planned, scheduled, stepDone instant
}

// instant is a moment as nanoseconds of the monotonic clock since the
// package's epoch; 0 is "not seen". It holds no pointer.
type instant int64

// epoch is what instants count from.
var epoch = time.Now()

// at is t as an instant (0 for the zero time).
func at(t time.Time) instant {
	if t.IsZero() {
		return 0
	}
	return instant(max(t.Sub(epoch), 1))
}

// now is the current instant.
func now() instant { return at(time.Now()) }

// IsZero reports whether i is "not seen".
func (i instant) IsZero() bool { return i == 0 }

// Sub is the duration i - j.
func (i instant) Sub(j instant) time.Duration { return time.Duration(i - j) }

// Before reports whether i is before j.
func (i instant) Before(j instant) bool { return i < j }

// loopResult is what a closed-loop run measured.
type loopResult struct {
	Completed int           // outcomes inside the window
	Window    time.Duration // the measured window
	Timeouts  int
	Sent      int
	// Achieved (open loop): sampled turns over the time from the first
	// one's publish to the last one's outcome.
	Achieved float64
	// Closed loop: the times of the turns that ended inside the window;
	// the turns that failed (other than timing out), and the first error.
	Turns  []turnTimes
	Failed int
	Err    error
}

func (r loopResult) rate() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Window.Seconds()
}

// closedLoop runs conc slots, each running one turn at a time
// (one(session), which returns when the turn ended) for warm+window. Each
// slot cycles over sessionsPerSlot sessions of its own (named from run),
// so that a session is free again (released by its previous turn) long
// before it is reused: every turn takes the common path of a known, idle
// session. Turns that ended inside the window are counted and their times
// kept. A turn that timed out (errTurnTimeout) is counted and its slot
// goes on; any other error stops its slot and is counted as failed.
// onWindow, if set, is called when the window opens and when it closes.
//
// With minTurns > 0 the window stays open past its length until minTurns
// turns ended inside it, at most turnTimeout longer (Config.MinTurns: the
// smoke tests' tiny windows on a loaded machine); the result's Window is
// the length it had.
func closedLoop(ctx context.Context, run string, conc, sessionsPerSlot, minTurns int, warm, window time.Duration, onWindow func(open bool), one func(ctx context.Context, session string) (turnTimes, error)) loopResult {
	start := time.Now()
	from, end := start.Add(warm), start.Add(warm+window)
	to := end // read by the slots under mu; written only below, under mu
	res := loopResult{Window: window}
	var mu sync.Mutex
	enough := make(chan struct{}) // closed when minTurns ended in the window
	if minTurns > 0 {
		to = end.Add(turnTimeout) // the longest it may stay open
	} else {
		close(enough)
	}
	open := func() bool { // under mu
		return time.Now().Before(to)
	}
	var wg sync.WaitGroup
	for slot := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				mu.Lock()
				more := open()
				mu.Unlock()
				if !more {
					return
				}
				tt, err := one(ctx, fmt.Sprintf("%s-s%d-%d", run, slot, k%sessionsPerSlot))
				failed := err != nil && !errors.Is(err, errTurnTimeout)
				mu.Lock()
				switch {
				case failed:
					res.Failed++
					if res.Err == nil {
						res.Err = err
					}
				case err != nil:
					res.Sent++
					res.Timeouts++
				default:
					res.Sent++
					if !tt.done.Before(at(from)) && tt.done.Before(at(to)) {
						res.Completed++
						res.Turns = append(res.Turns, tt)
						if res.Completed == minTurns {
							close(enough)
						}
					}
				}
				mu.Unlock()
				if failed {
					return
				}
			}
		}()
	}
	if onWindow != nil || minTurns > 0 {
		time.Sleep(time.Until(from))
		if onWindow != nil {
			onWindow(true)
		}
		time.Sleep(time.Until(end))
		if minTurns > 0 {
			// Open past its length until enough turns ended in it.
			select {
			case <-enough:
			case <-time.After(time.Until(to)):
			case <-ctx.Done():
			}
			mu.Lock()
			if now := time.Now(); now.Before(to) {
				to = now
			}
			res.Window = to.Sub(from)
			mu.Unlock()
		}
		if onWindow != nil {
			onWindow(false)
		}
	}
	wg.Wait()
	return res
}

// turn sends a new turn of session and waits for its outcome, at most
// turnTimeout (errTurnTimeout).
func (d *driver) turn(ctx context.Context, session string) (turnTimes, error) {
	t, err := d.send(session)
	if err != nil {
		return turnTimes{}, err
	}
	select {
	case <-t.done:
		d.mu.Lock() // the planner path's moments are set under d.mu
		tt := turnTimes{sent: at(t.sent), pending: at(t.requested), decided: at(t.decided), done: at(t.doneAt), planned: at(t.planned), scheduled: at(t.scheduled), stepDone: at(t.stepDone)}
		d.mu.Unlock()
		return tt, nil
	case <-time.After(turnTimeout):
		return turnTimes{}, errTurnTimeout
	case <-ctx.Done():
		return turnTimes{}, ctx.Err()
	}
}

// poolCycle is how long the open loop takes to come back to a session.
const poolCycle = 20 * time.Second

// openLoop sends turns at rate per second for warm+window, each in the
// next session of a pool large enough that a session's previous turn has
// long ended, then waits for the outstanding outcomes. Latencies are
// sampled from turns sent after warm.
//
// The pool is reused every poolCycle: with a two-second cycle (until
// session 23), a pipeline that fell a little behind met each session's
// previous turn still running, queued the new one (more writes) and fell
// further behind, so the open loop measured that feedback rather than
// the load (docs/bench.md, "Step seven, its last part").
func (d *driver) openLoop(ctx context.Context, rate float64, warm, window time.Duration) (loopResult, error) {
	pool := max(256, int(rate*poolCycle.Seconds()))
	start := time.Now()
	end := start.Add(warm + window)
	sampling := false
	var all []*turn
	for i := 0; ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if !due.Before(end) {
			break
		}
		time.Sleep(time.Until(due))
		if !sampling && time.Since(start) >= warm {
			sampling = true
			if err := d.sampleLatency(); err != nil {
				return loopResult{}, err
			}
		}
		t, err := d.send(fmt.Sprintf("%s-o-%d", d.run, i%pool))
		if err != nil {
			return loopResult{}, err
		}
		all = append(all, t)
	}
	res := loopResult{Sent: len(all), Window: window}
	deadline := time.After(turnTimeout)
	var first, last time.Time
	sampled := 0
	for _, t := range all {
		select {
		case <-t.done:
			res.Completed++
			if t.sent.Sub(start) >= warm {
				sampled++
				if first.IsZero() {
					first = t.sent
				}
				if t.doneAt.After(last) {
					last = t.doneAt
				}
			}
		case <-deadline:
			res.Timeouts++
		}
	}
	if sampled > 1 && last.After(first) {
		res.Achieved = float64(sampled) / last.Sub(first).Seconds()
	}
	return res, nil
}

// latencySamples returns a copy of what sampleLatency recorded (empty if
// it was not started).
func (d *driver) latencySamples() *latencies {
	d.mu.Lock()
	l := d.lat
	d.mu.Unlock()
	if l == nil {
		return &latencies{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return &latencies{from: l.from, outcome: slices.Clone(l.outcome), decision: slices.Clone(l.decision),
		finished: slices.Clone(l.finished), call: slices.Clone(l.call)}
}

// waitAsync waits until every async publish of the driver is acknowledged.
func (d *driver) waitAsync(timeout time.Duration) error {
	select {
	case <-d.js.PublishAsyncComplete():
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%d async publishes unacknowledged after %v", d.js.PublishAsyncPending(), timeout)
	}
}
