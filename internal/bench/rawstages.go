package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// rawStages is the minimal program behind the raw-turn reference: four
// "stages" that consume the same streams with the same consumer settings
// and concurrency as Tollgate's runners (explicit ack, AckWait 30s,
// MaxAckPending 1024, pulls of 256, messages of one subject key handled in
// order) and, for each message, perform the operations of the raw
// sequence's group for it, with payloads of the traced sizes. There is no
// decoding (ids come from subjects, message-id headers and the driver's
// Bench-* headers; a batch record, a bucket's value or a turn log's event,
// starts with its session key), no policy, no seal and no tool.
type rawStages struct {
	js   jetstream.JetStream
	kv   map[string]jetstream.KeyValue
	path path
	plan map[string][]rawGroup
	// layout is where the writes go (layout.go); w makes them in any
	// layout but today's unbatched one (nil there: the code that is the
	// raw turn's reference).
	layout rawLayout
	w      *rawWriter
	// log is the turn logs the appends go to: design (b)'s, or in the
	// other layouts Tollgate's, where its stages keep the batch records
	// (bound as they bind them: topology.OpenTurnLogs); parts is their
	// number of partitions (design (a): its batch buckets').
	log   *turnlog.Log
	parts int
	// order appends the turns of today's sequence to their sessions'
	// orders as ingest does (jetstream/turnorder: a compare-and-set
	// against the session's last entry, which it remembers); nil in the
	// designs, whose ingest publishes as it did when they were measured.
	order   *turnorder.Writer
	configs rawConfigs // the consumers of each stage (layout.stageConfigs)

	// watched is the last revision of each approval that the approver's
	// watch of the approvals bucket delivered (key -> uint64): the raw
	// approver's compare-and-set is made at it, as Tollgate's approver
	// makes it at its pending tracker's (approver.PendingTracker.Latest).
	watched sync.Map
	// awaiting is the last event of each turn whose log's last event the
	// redriver's watch delivered as awaiting (turn -> turnlog.Event): the
	// raw redriver's start is appended after it, as Tollgate's redriver
	// appends after its sweep's (Redriver.redrive, watched).
	awaiting sync.Map

	ctx     context.Context
	stop    context.CancelFunc
	watchWG sync.WaitGroup
	mu      sync.Mutex
	running map[string]*rawRun
	streams map[string]jetstream.Stream

	errs      atomic.Int64
	conflicts atomic.Int64
	waits     atomic.Int64 // turns that waited for their predecessor to end (the two designs)
	retries   atomic.Int64 // messages NAKed for a retry (a decided event before its batch's awaiting append)
	lastErr   atomic.Value
}

// rawRun is one running raw stage.
type rawRun struct {
	ccs   []jetstream.ConsumeContext
	sub   *nats.Subscription // the requests it answers, if any
	chans []chan jetstream.Msg
	wg    sync.WaitGroup
}

// rawConsumer is the durable name of a raw stage's (first) consumer.
func rawConsumer(stage string) string { return "raw-" + stage }

// rawSource is one durable consumer that triggers a raw stage: a stream
// and the subject filters it delivers.
type rawSource struct {
	stream  string
	filters []string
}

// rawStageConfig mirrors the stage's runner configuration: the consumers
// that trigger it (a layout defines its own: rawLayout.stageConfigs), the
// requests it answers (a queue subscription, as the approver's decision
// service: each request is handled as a message of its own, acknowledged
// by its answer) and how many messages it handles at once.
type rawStageConfig struct {
	sources     []rawSource
	concurrency int
	requests    string
}

// rawStageConfigs are Tollgate's stages' consumers today.
var rawStageConfigs = rawConfigs{
	"ingest":   {sources: []rawSource{{topology.StreamInbound, []string{topology.SubjectInboundPrefix + ">"}}}, concurrency: 16},
	"executor": {sources: []rawSource{{topology.StreamTurns, []string{topology.OrderFilter(topology.OrderExec), topology.SubjectTurnAccepted + "*", topology.SubjectTurnReady + "*"}}}, concurrency: 64},
	"approver": {concurrency: 32, requests: topology.SubjectDecide + "*.*"},
	"redriver": {sources: []rawSource{{topology.StreamApprovals, []string{topology.ApprovalRevisions}}, {topology.StreamEvents, []string{topology.SubjectBatchAwaiting + "*"}}}, concurrency: 64},
}

// streamApprover is the approver as it consumed decisions from
// TOLLGATE_DECISIONS before it answered them as requests: the layout
// phase's two designs were measured so (rawseq.go), and keep it.
var streamApprover = rawStageConfig{sources: []rawSource{{topology.StreamDecisions, []string{topology.SubjectDecisionSubmit + ">"}}}, concurrency: 32}

// rawGroup is the operations a stage performs for a message whose subject
// starts with trigger, or, for a trigger "fact:<name>", a message whose
// Bench-Fact header is that name (a change-stream message of the two
// designs, rawseq.go).
type rawGroup struct {
	trigger string
	ops     []step
}

// matches reports whether m runs g.
func (g rawGroup) matches(m jetstream.Msg) bool {
	if fact, ok := strings.CutPrefix(g.trigger, "fact:"); ok {
		return m.Headers().Get(hdrFact) == fact
	}
	return strings.HasPrefix(m.Subject(), g.trigger)
}

// rawPlan splits a raw sequence into each stage's groups.
func rawPlan(seq []step) map[string][]rawGroup {
	plan := map[string][]rawGroup{}
	var pending = map[string][]step{}
	for _, s := range seq {
		switch {
		case s.Stage == "client":
		case s.Op == "consume+ack" || s.Op == "answer":
			plan[s.Stage] = append(plan[s.Stage], rawGroup{trigger: s.Trigger, ops: pending[s.Stage]})
			pending[s.Stage] = nil
		default:
			pending[s.Stage] = append(pending[s.Stage], s)
		}
	}
	return plan
}

var zeros = make([]byte, 1<<20)

// startRawStages starts the raw stages (all four if none are named) on js
// for the sequence seq of path p.
func startRawStages(js jetstream.JetStream, seq []step, p path, stages ...string) (*rawStages, error) {
	return startRawStagesIn(js, seq, p, rawLayout{}, stages...)
}

// startRawStagesIn is startRawStages with the writes stored in layout l
// (layout.go).
func startRawStagesIn(js jetstream.JetStream, seq []step, p path, l rawLayout, stages ...string) (*rawStages, error) {
	if len(stages) == 0 {
		stages = stageNames
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rawStages{js: js, kv: map[string]jetstream.KeyValue{}, path: p, plan: rawPlan(seq), ctx: ctx, stop: cancel, running: map[string]*rawRun{},
		layout: l, configs: l.stageConfigs()}
	if l != (rawLayout{}) {
		r.w = &rawWriter{js: js}
	}
	r.parts = l.partitions
	switch l.design {
	case designEvents:
		// Design (b)'s appends go through the product's turn-log writer,
		// on the streams ensureLayout made (the same names, subjects and
		// partitioning as topology.TurnLogStreams).
		log, err := turnlog.New(ctx, js, topology.Config{TurnLogPartitions: max(l.partitions, 1)})
		if err != nil {
			cancel()
			return nil, err
		}
		r.log = log
	case designToday:
		// Today's batch records are appends to Tollgate's turn logs,
		// made as its stages make them: one compare-and-set publish each,
		// in every layout of today's sequence.
		streams, err := topology.OpenTurnLogs(ctx, js)
		if err != nil {
			cancel()
			return nil, err
		}
		r.log = turnlog.Bind(js, streams)
		r.parts = r.log.Partitions()
		if r.order, err = turnorder.New(ctx, js); err != nil {
			cancel()
			return nil, err
		}
	}
	for _, b := range l.buckets() {
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			cancel()
			return nil, err
		}
		r.kv[b] = kv
	}
	for _, stage := range stages {
		if err := r.start(stage); err != nil {
			r.close()
			return nil, err
		}
	}
	// Tollgate's approver watches the approvals bucket (its pending set and
	// expiry) and its redriver the turn logs and the batches and sessions
	// buckets (the recovery sweep); the raw stages run the layout's watches
	// and discard what they receive.
	for stage, bucket := range l.watches() {
		if !slices.Contains(stages, stage) {
			continue
		}
		if err := r.watch(ctx, bucket); err != nil {
			r.close()
			return nil, err
		}
		if bucket == topology.BucketBatches && r.log != nil {
			if err := r.watchLogs(ctx); err != nil {
				r.close()
				return nil, err
			}
		}
		if bucket == topology.BucketBatches {
			// The sweep also watches the sessions bucket (idle sessions).
			if err := r.watch(ctx, topology.BucketSessions); err != nil {
				r.close()
				return nil, err
			}
		}
	}
	return r, nil
}

// watchLogs follows the last events of every turn of the turn logs until
// ctx ends, as the redriver's recovery sweep does (turnlog.Watch).
func (r *rawStages) watchLogs(ctx context.Context) error {
	w, err := r.log.Watch(ctx)
	if err != nil {
		return err
	}
	drain(r, ctx, w.Updates(), w.Stop, func(ev *turnlog.Event) {
		switch {
		case ev == nil:
		case ev.Name == topology.EventTurnAwaiting:
			r.awaiting.Store(ev.Turn, *ev)
		default:
			r.awaiting.Delete(ev.Turn)
		}
	})
	return nil
}

// watch runs a KV watch of every key of bucket until ctx ends (in the
// state layout, of every key under the bucket's prefix).
func (r *rawStages) watch(ctx context.Context, bucket string) error {
	pb, prefix := r.layout.place(bucket, ">")
	w, err := r.kv[pb].Watch(ctx, prefix)
	if err != nil {
		return err
	}
	var each func(jetstream.KeyValueEntry)
	if bucket == topology.BucketApprovals {
		// The approver keeps each approval's last revision (rawStages.watched).
		each = func(e jetstream.KeyValueEntry) {
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				r.watched.Store(e.Key(), e.Revision())
			}
		}
	}
	drain(r, ctx, w.Updates(), func() { _ = w.Stop() }, each)
	return nil
}

// drain reads a watch's updates, as its reader would, until ctx ends or
// they close, then stops it; each, when not nil, is given every update.
func drain[T any](r *rawStages, ctx context.Context, updates <-chan T, stop func(), each func(T)) {
	r.watchWG.Add(1)
	go func() {
		defer r.watchWG.Done()
		defer stop()
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				if each != nil {
					each(u)
				}
			}
		}
	}()
}

// consumer is stage's durable consumer; "" for a stage that consumes
// nothing (the approver, which answers requests).
func (r *rawStages) consumer(stage string) string {
	return r.configs.consumer(stage)
}

// rawConfigs are the raw stages' configurations, by stage.
type rawConfigs map[string]rawStageConfig

// consumer is stage's durable consumer; "" for a stage that consumes
// nothing (the approver, which answers requests).
func (c rawConfigs) consumer(stage string) string {
	if len(c[stage].sources) == 0 {
		return ""
	}
	return rawConsumer(stage)
}

// resume starts stage if it is not running (errors are counted, and
// returned). Its watches are not stopped by pause: it is ready at once.
func (r *rawStages) resume(stage string) error {
	if err := r.start(stage); err != nil {
		r.fail(err)
		return err
	}
	return nil
}

func (r *rawStages) start(stage string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[stage] != nil {
		return nil
	}
	c := r.configs[stage]
	var conss []jetstream.Consumer
	for i, src := range c.sources {
		cc := jetstream.ConsumerConfig{
			Durable: rawConsumer(stage), AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
			MaxDeliver: -1, MaxAckPending: 1024,
		}
		if i > 0 {
			cc.Durable += "-" + strconv.Itoa(i)
		}
		if len(src.filters) == 1 {
			cc.FilterSubject = src.filters[0]
		} else {
			cc.FilterSubjects = src.filters
		}
		cons, err := r.js.CreateOrUpdateConsumer(r.ctx, src.stream, cc)
		if err != nil {
			return fmt.Errorf("raw %s: %w", stage, err)
		}
		conss = append(conss, cons)
	}
	run := &rawRun{chans: make([]chan jetstream.Msg, c.concurrency)}
	groups := r.plan[stage]
	for i := range run.chans {
		ch := make(chan jetstream.Msg, 1024)
		run.chans[i] = ch
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			for m := range ch {
				r.handle(r.ctx, stage, groups, m)
			}
		}()
	}
	// Messages of one key (a subject's last token; in the two designs the
	// turn, which their writes carry in a header) are handled in order.
	lane := func(m jetstream.Msg) chan jetstream.Msg {
		key := m.Headers().Get(hdrTurn)
		if key == "" {
			key = lastToken(m.Subject())
		}
		h := fnv.New32a()
		h.Write([]byte(key))
		return run.chans[h.Sum32()%uint32(len(run.chans))]
	}
	if c.requests != "" {
		sub, err := r.js.Conn().QueueSubscribe(c.requests, rawConsumer(stage), func(m *nats.Msg) {
			rm := requestMsg{m}
			lane(rm) <- rm
		})
		if err != nil {
			for _, ch := range run.chans {
				close(ch)
			}
			return fmt.Errorf("raw %s: serve %s: %w", stage, c.requests, err)
		}
		run.sub = sub
		if err := r.js.Conn().Flush(); err != nil { // answered from the first request on
			r.fail(err)
		}
	}
	for _, cons := range conss {
		cc, err := cons.Consume(func(m jetstream.Msg) { lane(m) <- m }, jetstream.PullMaxMessages(256))
		if err != nil {
			for _, cc := range run.ccs {
				cc.Stop()
			}
			for _, ch := range run.chans {
				close(ch)
			}
			return fmt.Errorf("raw %s: consume: %w", stage, err)
		}
		run.ccs = append(run.ccs, cc)
	}
	r.running[stage] = run
	return nil
}

// pause drains stage: no more pulls, every message received is handled.
func (r *rawStages) pause(stage string) error {
	r.mu.Lock()
	run := r.running[stage]
	delete(r.running, stage)
	r.mu.Unlock()
	if run == nil {
		return nil
	}
	if run.sub != nil {
		// Every request received is handed to a lane before the lanes
		// close: wait for the drained subscription to close.
		closed := run.sub.StatusChanged(nats.SubscriptionClosed)
		if err := run.sub.Drain(); err != nil {
			r.fail(err)
		}
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			_ = run.sub.Unsubscribe()
		}
	}
	for _, cc := range run.ccs {
		cc.Drain()
	}
	for _, cc := range run.ccs {
		select {
		case <-cc.Closed():
		case <-time.After(30 * time.Second):
			cc.Stop()
		}
	}
	for _, ch := range run.chans {
		close(ch)
	}
	run.wg.Wait()
	return nil
}

func (r *rawStages) close() {
	for _, s := range stageNames {
		_ = r.pause(s)
	}
	r.stop()
	r.watchWG.Wait()
}

// stream is a handle on stream, looked up once.
func (r *rawStages) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.streams[name]; s != nil {
		return s, nil
	}
	s, err := r.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	if r.streams == nil {
		r.streams = map[string]jetstream.Stream{}
	}
	r.streams[name] = s
	return s, nil
}

func (r *rawStages) fail(err error) {
	r.errs.Add(1)
	r.lastErr.Store(err.Error())
}

// rawIDs are the ids a raw stage substitutes for the placeholders, and the
// turn's inbound stream sequence (ingest writes it into the first bytes of
// the accepted turn it publishes, where Tollgate's TurnContext carries it).
type rawIDs struct {
	turn, session, approval string
	inboundSeq              uint64
	// The two designs: the turn's predecessor in its session (ingest
	// looks it up and stamps it on the accepted turn, Bench-Pred), and
	// the partitions of the turn's and the predecessor's state writes.
	pred           string
	part, predPart string
}

func (r *rawStages) ids(stage string, m jetstream.Msg) rawIDs {
	var id rawIDs
	subj := m.Subject()
	switch stage {
	case "ingest":
		id.turn, id.session = m.Headers().Get(hdrTurn), m.Headers().Get(hdrSession)
		if md, err := m.Metadata(); err == nil {
			id.inboundSeq = md.Sequence.Stream
		}
	case "executor":
		id.turn, id.session = m.Headers().Get(jetstream.MsgIDHeader), lastToken(subj)
		if t, _, ok := topology.ParseOrderMsgID(id.turn); ok {
			id.turn = t // an entry of the session's order
		}
		if d := m.Data(); len(d) >= 8 {
			id.inboundSeq = binary.BigEndian.Uint64(d)
		}
	case "approver":
		id.approval = lastToken(subj)
		id.turn = schemas.TurnIDOfApproval(id.approval)
	case "redriver":
		id.turn = lastToken(subj) // the session key is read from the batch value
		if strings.HasPrefix(subj, "$KV.") {
			// A decision's revision (in the approvals bucket, or the state
			// stream): its key ends in the approval id.
			id.approval = id.turn
			id.turn = schemas.TurnIDOfApproval(id.approval)
		}
	}
	if r.layout.oneWritePerFact() {
		// The designs' writes name their turn and session in headers
		// (the stages would decode them from the records and events).
		h := m.Headers()
		if t := h.Get(hdrTurn); t != "" && stage != "ingest" {
			id.turn = t
		}
		if s := h.Get(hdrSession); s != "" && stage != "ingest" {
			id.session = s
		}
		id.pred = h.Get(hdrPred)
	}
	if id.approval == "" && id.turn != "" {
		id.approval = schemas.ApprovalID(id.turn, r.path.approvalIndex())
	}
	id.setParts(r.parts)
	return id
}

// setParts sets the partitions, of parts, of the turn and its
// predecessor (topology.TurnLogPartition; 0 with one or none).
func (id *rawIDs) setParts(parts int) {
	part := func(turn string) string {
		if parts <= 1 {
			return "0"
		}
		return strconv.Itoa(topology.TurnLogPartition(turn, parts))
	}
	id.part, id.predPart = part(id.turn), part(id.pred)
}

func (id rawIDs) resolve(s string) string {
	s = strings.ReplaceAll(s, "<grant-index>", benchGrantIndex)
	s = strings.ReplaceAll(s, "<pred>", id.pred)
	s = strings.ReplaceAll(s, "<pp>", id.predPart)
	s = strings.ReplaceAll(s, "<p>", id.part)
	s = strings.ReplaceAll(s, "<approval>", id.approval)
	s = strings.ReplaceAll(s, "<turn>", id.turn)
	return strings.ReplaceAll(s, "<session>", id.session)
}

// benchGrantIndex is the grant index the executor reads for the bench's
// gated call: write_file, requested by cli:alice (driver.inbound).
var benchGrantIndex = schemas.GrantIndexKey("write_file", "cli:alice")

// sessionKeyLen is the length of schemas.SessionKey's keys.
const sessionKeyLen = 2 + 32

func (r *rawStages) handle(ctx context.Context, stage string, groups []rawGroup, m jetstream.Msg) {
	var g *rawGroup
	for i := range groups {
		if groups[i].matches(m) {
			g = &groups[i]
			break
		}
	}
	if g == nil {
		_ = m.Ack() // not part of this path's sequence
		return
	}
	id := r.ids(stage, m)
	revs := map[string]uint64{}
	skip := "" // a session created instead of read: its update is skipped
	for _, op := range g.ops {
		if strings.Contains(op.On, "<pred>") && id.pred == "" {
			continue // a session's first turn: no predecessor to wait for
		}
		target := id.resolve(op.On)
		bucket, key, _ := strings.Cut(target, "/")
		pb, pk := r.layout.place(bucket, key) // where it is stored
		kv := r.kv[pb]
		payload := zeros[:op.Bytes]
		switch {
		case (bucket == topology.BucketBatches || op.Op == "log.append") && op.Bytes > sessionKeyLen:
			// A batch record, in the bucket or the turn's log: the stage
			// that reads it takes the session from it.
			payload = make([]byte, op.Bytes)
			copy(payload, id.session)
			if op.Fact != "" {
				payload[sessionKeyLen] = op.Fact[0] // the record's state (ended: factOutcome)
			}
		case op.Op == "publish" && (strings.HasPrefix(target, topology.SubjectTurnAccepted) || strings.HasPrefix(target, topology.SubjectTurnOrder)) && op.Bytes >= 8:
			payload = make([]byte, op.Bytes)
			binary.BigEndian.PutUint64(payload, id.inboundSeq)
		}
		switch op.Op {
		case "publish":
			if kind, key, ok := topology.ParseOrderSubject(target); ok && r.order != nil {
				// The accepted turn, appended to its session's order.
				if _, err := r.order.Append(ctx, turnorder.Append{Kind: kind, Key: key, Turn: id.turn, Arrival: id.inboundSeq,
					Data: payload, Header: r.factHeader(id, op)}); err != nil {
					r.fail(err)
				}
				continue
			}
			msgID := target
			if strings.HasPrefix(target, topology.SubjectTurnAccepted) {
				msgID = topology.AcceptedMsgID(id.turn)
			}
			var opts []jetstream.PublishOpt
			if op.MsgID {
				opts = append(opts, jetstream.WithMsgID(msgID))
			}
			msg := &nats.Msg{Subject: target, Data: payload}
			if r.w != nil {
				// Through the layout's writer, with the designs' fact
				// headers; the stage waits for the acknowledgement.
				msg.Header = r.factHeader(id, op)
				if op.MsgID {
					msg.Header.Set(jetstream.MsgIDHeader, msgID)
				}
				if _, err := r.w.publish(ctx, msg); err != nil {
					r.fail(err)
				}
				continue
			}
			if _, err := r.js.PublishMsg(ctx, msg, opts...); err != nil {
				r.fail(err)
			}
		case "log.append":
			// Design (b): a compare-and-set against the turn's last event.
			last := turnWildcard(target)
			tok := strings.Split(target, ".") // tollgate.turnlog.<p>.<turn>.<event>
			if _, read := revs[last]; !read && stage == "redriver" {
				// After the awaiting event the watch delivered; one it has
				// not delivered yet is read, as Tollgate's redriver does.
				if v, ok := r.awaiting.Load(tok[3]); ok {
					ev := v.(turnlog.Event)
					revs[last] = ev.Seq
					if id.session == "" && len(ev.Data) >= sessionKeyLen {
						id.session = string(ev.Data[:sessionKeyLen])
					}
				} else if st, err := r.stream(ctx, topology.StreamTurnLogPrefix+tok[2]); err == nil {
					if m, err := st.GetLastMsgForSubject(ctx, last); err == nil {
						revs[last] = m.Sequence
						if id.session == "" && len(m.Data) >= sessionKeyLen {
							id.session = string(m.Data[:sessionKeyLen])
						}
					}
				}
			}
			seq, err := r.log.Append(ctx, turnlog.Append{Turn: tok[3], Event: tok[4], After: revs[last],
				MsgID: target, Header: r.factHeader(id, op), Data: payload})
			switch {
			case err == nil:
				revs[last] = seq
			case conflict(err):
				r.conflicts.Add(1)
			default:
				r.fail(err)
			}
		case "kv.create", opCreateExists:
			rev, err := r.create(ctx, kv, pb, pk, payload, id, op)
			switch {
			case err == nil:
				revs[target] = rev
				if op.Op == opCreateExists {
					skip = target
				}
			case conflict(err) && op.Op == opCreateExists:
			case conflict(err) && r.layout.oneWritePerFact():
				r.conflicts.Add(1)
			default:
				r.fail(err)
			}
		case "kv.get":
			e, err := kv.Get(ctx, pk)
			if errors.Is(err, jetstream.ErrKeyNotFound) && bucket == topology.BucketGrants {
				continue // no standing grant: the call asks a person, as in Tollgate
			}
			if errors.Is(err, jetstream.ErrKeyNotFound) && key == id.pred {
				continue // the predecessor made no batch: nothing to wait for
			}
			if errors.Is(err, jetstream.ErrKeyNotFound) && bucket == topology.BucketBatches && !r.layout.oneWritePerFact() {
				continue // no earlier version's batch of the turn: it is created in the turn's log
			}
			if errors.Is(err, jetstream.ErrKeyNotFound) && bucket == topology.BucketApprovals && r.layout.oneWritePerFact() {
				if stage != "approver" {
					continue // the redriver at the awaiting write: the approval is not written yet
				}
				// The driver saw the approval's write as the server routed
				// it, which can be before the bucket stored it (a UI
				// reading the bucket cannot): look again until it is there.
				var e2 jetstream.KeyValueEntry
				err = r.poll(ctx, func() (bool, error) {
					var gerr error
					e2, gerr = kv.Get(ctx, pk)
					return gerr == nil, gerr
				})
				e = e2
			}
			if err == nil && key == id.pred && !recordEnded(e.Value()) {
				r.waits.Add(1)
				e, err = nil, r.poll(ctx, func() (ended bool, err error) {
					e, err := kv.Get(ctx, pk)
					return err == nil && recordEnded(e.Value()), err
				})
			}
			if err != nil {
				r.fail(err)
				continue
			}
			if e != nil {
				revs[target] = e.Revision()
			}
			if bucket == topology.BucketBatches && id.session == "" && e != nil && len(e.Value()) >= sessionKeyLen {
				id.session = string(e.Value()[:sessionKeyLen])
			}
		case "kv.update":
			if target == skip {
				skip = ""
				continue
			}
			if _, read := revs[target]; !read && stage == "approver" && bucket == topology.BucketApprovals {
				// At the revision the watch delivered; one the watch has
				// not delivered yet is read, as Tollgate's approver does.
				if v, ok := r.watched.Load(pk); ok {
					revs[target] = v.(uint64)
				} else if e, err := kv.Get(ctx, pk); err == nil {
					revs[target] = e.Revision()
				}
			}
			rev, err := r.update(ctx, kv, pb, pk, payload, revs[target], id, op)
			switch {
			case err == nil:
				revs[target] = rev
			case conflict(err):
				// Another raw stage wrote the key in between (the two
				// redriver triggers of a turn racing the executor): the
				// round trip was made; Tollgate would re-read and retry.
				r.conflicts.Add(1)
			default:
				r.fail(err)
			}
		case "stream.get":
			// "<stream> last <subject>": the stream's last message on
			// subject (or wildcard). "<stream> next <filter>": the first
			// message on filter from the turn's inbound sequence on (the
			// executor's session-order lookup; Tollgate starts at the
			// session's watermark, and under load finds the turn's own
			// message).
			stream, subj, next := strings.Cut(target, " next ")
			if !next {
				stream, subj, _ = strings.Cut(target, " last ")
			}
			st, err := r.stream(ctx, stream)
			var last *jetstream.RawStreamMsg
			switch {
			case err != nil:
			case next:
				_, err = st.GetMsg(ctx, max(id.inboundSeq, 1), jetstream.WithGetMsgSubject(subj))
			default:
				last, err = st.GetLastMsgForSubject(ctx, subj)
			}
			switch {
			case err != nil:
			case op.Pred:
				// Ingest: the session's previous accepted turn is the
				// new turn's predecessor (its message id is its turn id).
				id.pred = last.Header.Get(jetstream.MsgIDHeader)
				id.setParts(r.parts)
			case strings.Contains(op.On, "<pred>") && last.Header.Get(hdrFact) != factOutcome:
				r.waits.Add(1)
				last, err = nil, r.poll(ctx, func() (bool, error) {
					m, err := st.GetLastMsgForSubject(ctx, subj)
					return err == nil && m.Header.Get(hdrFact) == factOutcome, err
				})
			case stage == "redriver" && !r.layout.oneWritePerFact() && beforeAwaiting(subj, last):
				// Tollgate's redriver NAKs a decided event that finds its
				// batch queued or running (errBeforeAwaiting) until the
				// executor's awaiting append; so does the raw one.
				r.retries.Add(1)
				if err := m.NakWithDelay(awaitingRetry(m)); err != nil {
					r.fail(err)
				}
				return
			case last != nil:
				revs[subj] = last.Sequence // a turn's last event: the next append's compare-and-set
				if id.session == "" && strings.HasPrefix(subj, topology.SubjectTurnLogPrefix) && len(last.Data) >= sessionKeyLen {
					id.session = string(last.Data[:sessionKeyLen]) // the batch record, as the bucket's value gave it
				}
			}
			// Not found is an answer too: a session's first turn has no
			// predecessor.
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				r.fail(err)
			}
		default:
			r.fail(fmt.Errorf("raw %s: unknown operation %q", stage, op.Op))
		}
	}
	if err := m.Ack(); err != nil {
		r.fail(err)
	}
}

// beforeAwaiting reports whether the last event of a turn's log (subj,
// its wildcard; last, nil if none) is a batch that does not wait for its
// approvals yet: queued or running, or no event at all.
func beforeAwaiting(subj string, last *jetstream.RawStreamMsg) bool {
	if !strings.HasPrefix(subj, topology.SubjectTurnLogPrefix) {
		return false
	}
	if last == nil {
		return true
	}
	event := lastToken(last.Subject)
	return event == string(schemas.BatchQueued) || event == string(schemas.BatchRunning)
}

// awaitingRetry is the delay of the raw redriver's NAK of an early decided
// event: Tollgate's (pipeline/redriver: 20ms doubling with each delivery,
// at most 5s).
func awaitingRetry(m jetstream.Msg) time.Duration {
	n := uint64(1)
	if md, err := m.Metadata(); err == nil {
		n = max(md.NumDelivered, 1)
	}
	return min(20*time.Millisecond<<min(n-1, 10), 5*time.Second)
}

// factHeader is the headers of the two designs' write op of turn id
// (the fact it makes durable, the turn, its session and predecessor);
// an empty header in the other layouts.
func (r *rawStages) factHeader(id rawIDs, op step) nats.Header {
	h := nats.Header{}
	if !r.layout.oneWritePerFact() {
		return h
	}
	if op.Fact != "" {
		h.Set(hdrFact, op.Fact)
	}
	h.Set(hdrTurn, id.turn)
	if id.session != "" {
		h.Set(hdrSession, id.session)
	}
	if id.pred != "" {
		h.Set(hdrPred, id.pred)
	}
	return h
}

// recordEnded reports whether a design (a) batch record is ended (its
// state byte, written by the raw stages, is the outcome's).
func recordEnded(v []byte) bool { return len(v) > sessionKeyLen && v[sessionKeyLen] == factOutcome[0] }

// pollWait bounds how long a raw stage waits for a record (a turn's
// predecessor to end, an approval to be stored), and pollEvery is how
// often it looks again.
const (
	pollWait  = turnTimeout
	pollEvery = time.Millisecond
)

// poll calls done until it reports true or an error other than not
// found, at most pollWait. (Tollgate's executor would be woken by the
// predecessor's outcome instead of polling; the bench's sessions rarely
// wait: a session's next turn is sent after its outcome.)
func (r *rawStages) poll(ctx context.Context, done func() (bool, error)) error {
	deadline := time.Now().Add(pollWait)
	for time.Now().Before(deadline) {
		if ok, err := done(); ok || (err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrMsgNotFound)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
	return fmt.Errorf("raw: nothing after %v", pollWait)
}

// create creates key in kv (bucket pb), through the layout's writer if
// there is one (the two designs' writes with a message id, the fact and
// the turn: op's of id).
func (r *rawStages) create(ctx context.Context, kv jetstream.KeyValue, pb, key string, value []byte, id rawIDs, op step) (uint64, error) {
	return r.update(ctx, kv, pb, key, value, 0, id, op)
}

// update updates key in kv (bucket pb) at revision rev (0: creates it),
// through the layout's writer if there is one.
func (r *rawStages) update(ctx context.Context, kv jetstream.KeyValue, pb, key string, value []byte, rev uint64, id rawIDs, op step) (uint64, error) {
	switch {
	case r.w != nil && r.layout.oneWritePerFact():
		return r.w.kvWrite(ctx, pb, key, value, rev, pb+"/"+key+":"+op.Fact, r.factHeader(id, op))
	case r.w != nil:
		return r.w.kvWrite(ctx, pb, key, value, rev, "", factOf(op))
	case op.Fact != "":
		// A fact the bucket's change stream announces (today's decision):
		// the write carries it as a header, which KeyValue.Update cannot.
		m := nats.NewMsg("$KV." + pb + "." + key)
		m.Data, m.Header = value, factOf(op)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
		ack, err := r.js.PublishMsg(ctx, m)
		var api *jetstream.APIError
		if errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return 0, fmt.Errorf("%s/%s: %w", pb, key, errWrongLast)
		}
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	case rev == 0:
		return kv.Create(ctx, key, value)
	}
	return kv.Update(ctx, key, value, rev)
}

// factOf is the Bench-Fact header of op's write in today's layouts (nil
// for a write that names no fact).
func factOf(op step) nats.Header {
	if op.Fact == "" {
		return nil
	}
	h := nats.Header{}
	h.Set(hdrFact, op.Fact)
	return h
}

// conflict reports a failed KV compare-and-set, however it was made.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, errWrongLast) || errors.Is(err, turnlog.ErrConflict)
}

// A raw stage process is this program's own executable started with these
// variables (see MaybeRunRawStage): the bench's reference for the stages
// run as separate processes.
const (
	envRawStage = "BENCH_RAW_STAGE" // the stage to run
	envRawURL   = "BENCH_RAW_URL"   // the NATS server
	envRawSeq   = "BENCH_RAW_SEQ"   // a JSON rawSeqFile
)

// rawSeqFile is the sequence a raw stage process runs.
type rawSeqFile struct {
	Path  string `json:"path"`
	Steps []step `json:"steps"`
}

// MaybeRunRawStage returns at once unless this process was started by the
// bench as a raw stage process; then it runs that stage until SIGTERM and
// exits. Call it first in the main (or TestMain) of a program that runs
// the procs phase: the bench starts raw stage processes from its own
// executable.
func MaybeRunRawStage() {
	stage := os.Getenv(envRawStage)
	if stage == "" {
		return
	}
	if err := runRawStage(stage, os.Getenv(envRawURL), os.Getenv(envRawSeq)); err != nil {
		fmt.Fprintf(os.Stderr, "raw stage %s: %v\n", stage, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runRawStage(stage, url, seqPath string) error {
	b, err := os.ReadFile(seqPath)
	if err != nil {
		return err
	}
	var f rawSeqFile
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	p := fastPath
	if f.Path == approvalPath.String() {
		p = approvalPath
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	nc, err := nats.Connect(url, nats.Name("bench-raw-"+stage), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	r, err := startRawStages(js, f.Steps, p, stage)
	if err != nil {
		return err
	}
	// The bench waits for this line from a stage that consumes nothing:
	// its subscriptions are on the server (start flushed them).
	fmt.Fprintln(os.Stderr, rawReadyLine)
	<-ctx.Done()
	r.close()
	last, _ := r.lastErr.Load().(string)
	fmt.Fprintf(os.Stderr, "%s%d %d %d %q\n", rawResultPrefix, r.errs.Load(), r.conflicts.Load(), r.retries.Load(), last)
	return nil
}

// rawReadyLine is the line a raw stage process logs once it is started.
const rawReadyLine = "raw stage ready"

// rawResultPrefix starts the line a raw stage process logs when it stops:
// its error count, conflict count, retry count and last error.
const rawResultPrefix = "raw stage result: "

// rawResults sums the result lines in the raw stage processes' logs.
func rawResults(logs []string) (errs, conflicts, retries int64, last string) {
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			rest, ok := strings.CutPrefix(line, rawResultPrefix)
			if !ok {
				continue
			}
			var e, c, n int64
			var msg string
			if k, _ := fmt.Sscanf(rest, "%d %d %d %q", &e, &c, &n, &msg); k >= 3 {
				errs, conflicts, retries = errs+e, conflicts+c, retries+n
				if msg != "" {
					last = msg
				}
			}
		}
	}
	return errs, conflicts, retries, last
}

// requestMsg is a request a raw stage answers (rawStageConfig.requests),
// handled as a consumed message is: its acknowledgement is the answer the
// approver's decision service gives a decision it applied (the same
// header, no body).
type requestMsg struct{ m *nats.Msg }

func (r requestMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return nil, errors.New("raw: a request has no stream metadata")
}
func (r requestMsg) Data() []byte         { return r.m.Data }
func (r requestMsg) Headers() nats.Header { return r.m.Header }
func (r requestMsg) Subject() string      { return r.m.Subject }
func (r requestMsg) Reply() string        { return r.m.Reply }
func (r requestMsg) Ack() error {
	return r.m.RespondMsg(&nats.Msg{Header: nats.Header{submit.HeaderResult: []string{string(submit.Applied)}}})
}
func (r requestMsg) DoubleAck(context.Context) error { return r.Ack() }

// A retry of a request is its sender's to make: handed back.
func (r requestMsg) Nak() error                       { return r.handBack() }
func (r requestMsg) NakWithDelay(time.Duration) error { return r.handBack() }
func (r requestMsg) InProgress() error                { return nil }
func (r requestMsg) Term() error                      { return r.handBack() }
func (r requestMsg) TermWithReason(string) error      { return r.handBack() }
func (r requestMsg) handBack() error {
	return r.m.RespondMsg(&nats.Msg{Header: nats.Header{micro.ErrorCodeHeader: []string{submit.NotTaken}}})
}
