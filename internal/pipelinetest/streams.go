// The streams: read what a stream stored (events, outcomes, requests,
// rejections, redrives, dead letters), and the waits on them, including
// the later facts (WaitConsumed, WaitIdle) after which an absence is
// asserted.

package pipelinetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Stored is one message as stored in a stream.
type Stored struct {
	Subject string
	Seq     uint64
	Data    []byte
	Header  nats.Header
}

// Messages returns every message stored in stream on subjects matching
// filter, in stream order. A read that fails part-way (on a cluster, a
// consumer placed or led by a node that has just gone away answers "no
// responders" until the cluster notices) is started again, for up to the harness's wait.
func (h *H) Messages(stream, filter string) []Stored {
	h.T.Helper()
	var out []Stored
	jstest.EventuallyState(h.T, h.wait, fmt.Sprintf("pipelinetest: read %s %s", stream, filter), func() (bool, string) {
		var err error
		if out, err = h.readAll(stream, filter); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// readAll reads every message stored in stream on subjects matching filter
// through an ephemeral consumer.
func (h *H) readAll(stream, filter string) ([]Stored, error) {
	ctx, cancel := h.Ctx()
	defer cancel()
	cons, err := h.JS.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	defer func() { _ = h.JS.DeleteConsumer(context.WithoutCancel(ctx), stream, cons.CachedInfo().Name) }()
	n := int(cons.CachedInfo().NumPending)
	out := make([]Stored, 0, n)
	for len(out) < n {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("metadata: %w", err)
			}
			out = append(out, Stored{Subject: m.Subject(), Seq: meta.Sequence.Stream, Data: m.Data(), Header: m.Headers()})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		if got == 0 {
			return nil, fmt.Errorf("fetched %d of %d messages", len(out), n)
		}
	}
	return out, nil
}

// Events returns the events stored on subjects matching filter.
func (h *H) Events(filter string) []Stored {
	h.T.Helper()
	return h.Messages(topology.StreamEvents, filter)
}

// DecodeAll decodes every message as a T, failing the test on any error.
func DecodeAll[T any, P schemas.Ptr[T]](t testing.TB, msgs []Stored) []*T {
	t.Helper()
	out := make([]*T, 0, len(msgs))
	for _, m := range msgs {
		v, err := schemas.Decode[T, P](m.Data)
		if err != nil {
			t.Fatalf("pipelinetest: decode %s #%d: %v", m.Subject, m.Seq, err)
		}
		out = append(out, v)
	}
	return out
}

// Outcomes returns every stored copy of turnID's outcome: the one its
// turn log's outcome event keeps (docs/protocol.md §4.2a), then each
// published on tollgate.event.turn.outcome.<turn> (only for a batch kept in
// tollgate_batches, or one an earlier version ended without keeping it).
// A turn that ended once has exactly one.
func (h *H) Outcomes(turnID string) []*schemas.TurnOutcome {
	h.T.Helper()
	var out []*schemas.TurnOutcome
	ctx, cancel := context.WithTimeout(context.Background(), h.wait)
	defer cancel()
	logged, err := h.Store.Batches.Log.Outcome(ctx, turnID)
	switch {
	case err == nil:
		out = append(out, logged)
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrNotEnded):
	default:
		h.T.Fatalf("pipelinetest: the outcome of %s in its log: %v", turnID, err)
	}
	return append(out, h.PublishedOutcomes(turnID)...)
}

// OutcomeEvent waits for the outcome event of turnID in its turn log (the
// write that ended its batch, whose record keeps the outcome) and returns
// it: its sequence, stored time and headers (a traced stage's span).
func (h *H) OutcomeEvent(turnID string) *turnlog.Event {
	h.T.Helper()
	var ev *turnlog.Event
	jstest.EventuallyState(h.T, h.wait, "the outcome event of "+turnID, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), h.wait)
		defer cancel()
		var err error
		if ev, err = h.Store.Batches.Log.Log.Last(ctx, turnID); err != nil {
			return false, err.Error()
		}
		return ev.Name == store.EventOutcome, "its last event is " + ev.Name
	})
	return ev
}

// StoredOutcomes returns every turn's stored outcomes (outcomes.Stored:
// the turn logs' and the published ones), by turn id. It reads until it
// gets an answer, for up to the harness's wait (-1 turns: not yet).
func (h *H) StoredOutcomes() map[string][]*schemas.TurnOutcome {
	h.T.Helper()
	var got map[string][]*schemas.TurnOutcome
	jstest.EventuallyState(h.T, h.wait, "pipelinetest: read the stored outcomes", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), h.wait)
		defer cancel()
		var err error
		if got, err = outcomes.Stored(ctx, h.JS); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return got
}

// PublishedOutcomes returns the outcomes of turnID published on
// tollgate.event.turn.outcome.<turn>.
func (h *H) PublishedOutcomes(turnID string) []*schemas.TurnOutcome {
	h.T.Helper()
	return DecodeAll[schemas.TurnOutcome](h.T, h.Events(topology.EventSubject(topology.SubjectTurnOutcome, turnID)))
}

// WaitOutcome waits for the outcome of turnID (Outcomes) and for its
// batch's finish (WaitFinished), and returns it; it fails if more than
// one copy is stored: a turn whose log keeps its outcome must have no
// published one.
func (h *H) WaitOutcome(turnID string) *schemas.TurnOutcome {
	h.T.Helper()
	var outs []*schemas.TurnOutcome
	jstest.Eventually(h.T, h.wait, "outcome of "+turnID, func() bool {
		outs = h.Outcomes(turnID)
		return len(outs) > 0
	})
	if len(outs) != 1 {
		h.T.Fatalf("turn %s has %d stored outcomes (its log's and published), want exactly 1", turnID, len(outs))
	}
	h.WaitFinished(turnID)
	return outs[0]
}

// WaitFinished waits until the finish of turnID's ended batch
// (batch.Engine.Finish, which follows the write that ends it) has taken
// effect: a failed batch's approvals are no longer pending (abandoned),
// and its session is no longer held by it with turns queued behind it
// (passed on). Tests that check those effects after an outcome wait here;
// WaitOutcome does.
func (h *H) WaitFinished(turnID string) {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.wait)
	defer cancel()
	b, _, err := h.Store.Batches.Get(ctx, turnID)
	if err != nil {
		h.T.Fatalf("pipelinetest: the batch of %s: %v", turnID, err)
	}
	if !b.State.Terminal() {
		h.T.Fatalf("pipelinetest: the batch of %s is %s, not ended", turnID, b.State)
	}
	jstest.Eventually(h.T, h.wait, "the finish of "+turnID, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), h.wait)
		defer cancel()
		if b.State == schemas.BatchFailed {
			for i := range b.Calls {
				a, _, err := h.Store.Approvals.Get(ctx, schemas.ApprovalID(turnID, i))
				if err == nil && a.Status == schemas.ApprovalPending {
					return false
				}
			}
		}
		if b.HeldBy != "" {
			return true // a loop's step: its loop holds the session
		}
		sess, _, err := h.Store.Sessions.Get(ctx, batch.SessionOf(b.Context).Key)
		return err != nil || sess.Active != turnID || len(sess.Queue) == 0
	})
}

// Requested returns the approvals requested for turnID: those its turn
// log's awaiting events keep (schemas.BatchRecord.Requested, each the
// record its approval-requested event announces), or, where its log
// keeps none (a batch kept in tollgate_batches), the published
// approval-requested events. While the executor also publishes the
// events for a log-kept turn (issue 36: its readers move to the log
// next), each published event must be byte for byte the log's: it
// fails the test otherwise.
func (h *H) Requested(turnID string) []*schemas.ApprovalRecord {
	h.T.Helper()
	logged := h.LoggedRequests(turnID)
	published := h.PublishedRequests(turnID)
	if len(logged) == 0 {
		return published
	}
	for _, p := range published {
		i := slices.IndexFunc(logged, func(l *schemas.ApprovalRecord) bool { return l.ApprovalID == p.ApprovalID })
		if i < 0 {
			h.T.Fatalf("pipelinetest: approval %s of %s was published as requested, and its log's awaiting events do not keep it", p.ApprovalID, turnID)
		}
		if a, b := encode(h.T, p), encode(h.T, logged[i]); !bytes.Equal(a, b) {
			h.T.Fatalf("pipelinetest: the published request of %s differs from its log's:\n%x\n%x", p.ApprovalID, a, b)
		}
	}
	return logged
}

// LoggedRequests returns the approvals that the awaiting events of
// turnID's log requested (store.DecodeRequested), oldest first.
func (h *H) LoggedRequests(turnID string) []*schemas.ApprovalRecord {
	h.T.Helper()
	p := topology.TurnLogPartition(turnID, len(h.Env.Buckets.TurnLogs))
	var out []*schemas.ApprovalRecord
	for _, m := range h.Messages(topology.TurnLogStream(p), topology.TurnLogSubject(p, turnID, store.EventAwaiting)) {
		reqs, err := store.DecodeRequested(turnID, m.Data)
		if err != nil {
			h.T.Fatalf("pipelinetest: the awaiting event of %s #%d: %v", turnID, m.Seq, err)
		}
		out = append(out, reqs...)
	}
	return out
}

// AllRequested returns every approval request stored, of every turn: the
// turn logs' awaiting events' (oldest first, partition by partition),
// then each published approval-requested event whose approval no log
// keeps (a batch kept in tollgate_batches).
func (h *H) AllRequested() []*schemas.ApprovalRecord {
	h.T.Helper()
	var out []*schemas.ApprovalRecord
	logged := map[string]bool{}
	for i := range h.Env.Buckets.TurnLogs {
		for _, m := range h.Messages(topology.TurnLogStream(i), topology.TurnLogAwaitingFilter(i)) {
			_, turn, _, _ := topology.ParseTurnLogSubject(m.Subject)
			reqs, err := store.DecodeRequested(turn, m.Data)
			if err != nil {
				h.T.Fatalf("pipelinetest: the awaiting event %s #%d: %v", m.Subject, m.Seq, err)
			}
			for _, a := range reqs {
				logged[a.ApprovalID] = true
			}
			out = append(out, reqs...)
		}
	}
	for _, a := range DecodeAll[schemas.ApprovalRecord](h.T, h.Events(topology.SubjectApprovalRequested+">")) {
		if !logged[a.ApprovalID] {
			out = append(out, a)
		}
	}
	return out
}

// PublishedRequests returns the approval-requested events of turnID
// published on tollgate.event.approval.requested.<turn>.
func (h *H) PublishedRequests(turnID string) []*schemas.ApprovalRecord {
	h.T.Helper()
	return DecodeAll[schemas.ApprovalRecord](h.T, h.Events(topology.EventSubject(topology.SubjectApprovalRequested, turnID)))
}

func encode(t testing.TB, r schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		t.Fatalf("pipelinetest: encode %T: %v", r, err)
	}
	return b
}

// WaitRequested waits until turnID has at least n approval-requested events
// and returns them all. An approval is announced after its batch's move to
// awaiting is durable, so the event follows the approval's KV write: a test
// that has seen the record pending waits here for its announcement.
func (h *H) WaitRequested(turnID string, n int) []*schemas.ApprovalRecord {
	h.T.Helper()
	var reqs []*schemas.ApprovalRecord
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%d approval-requested events of %s", n, turnID), func() bool {
		reqs = h.Requested(turnID)
		return len(reqs) >= n
	})
	return reqs
}

// Decisions returns the decisions of turnID's approvals as the approvals
// bucket's stream holds them (store.DecidedOf of each revision; the
// bucket keeps one per approval), in stream order. It fails the test on a
// published approval-decided event of the turn without Repeat that the
// bucket does not hold the same decision for.
func (h *H) Decisions(turnID string) []*schemas.DecidedEvent {
	h.T.Helper()
	var out []*schemas.DecidedEvent
	for _, m := range h.Messages(topology.StreamApprovals, topology.ApprovalRevisions) {
		ev, err := store.DecidedOf(m.Subject, m.Header, m.Data)
		if err != nil {
			h.T.Fatalf("pipelinetest: approvals bucket seq %d: %v", m.Seq, err)
		}
		if ev != nil && ev.TurnID == turnID {
			out = append(out, ev)
		}
	}
	for _, p := range h.Decided(turnID) {
		if p.Repeat != "" {
			continue
		}
		i := slices.IndexFunc(out, func(d *schemas.DecidedEvent) bool { return d.ApprovalID == p.ApprovalID })
		if i < 0 {
			continue // the decided record was written again (a retire rewrite, or an edit of a test)
		}
		if a, b := encode(h.T, p), encode(h.T, out[i]); !bytes.Equal(a, b) {
			h.T.Fatalf("pipelinetest: the published decision of %s differs from the bucket's:\n%x\n%x", p.ApprovalID, a, b)
		}
	}
	return out
}

// Decided returns the approval-decided events of turnID published on
// TOLLGATE_EVENTS (Decisions are the decisions themselves).
func (h *H) Decided(turnID string) []*schemas.DecidedEvent {
	h.T.Helper()
	return DecodeAll[schemas.DecidedEvent](h.T, h.Events(topology.EventSubject(topology.SubjectApprovalDecided, turnID)))
}

// Rejections returns the decision rejections stored under token (an approval
// id, or "invalid").
func (h *H) Rejections(token string) []*schemas.DecisionRejected {
	h.T.Helper()
	return DecodeAll[schemas.DecisionRejected](h.T, h.Events(topology.EventSubject(topology.SubjectDecisionRejected, token)))
}

// WaitRejection waits for the rejection of decision d and returns it.
func (h *H) WaitRejection(d *schemas.Decision) *schemas.DecisionRejected {
	h.T.Helper()
	token := d.ApprovalID
	if !schemas.ValidKey(token) {
		token = "invalid"
	}
	var got *schemas.DecisionRejected
	jstest.Eventually(h.T, h.wait, "rejection of decision "+d.DecisionID, func() bool {
		for _, r := range h.Rejections(token) {
			if r.DecisionID == d.DecisionID {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// Starts returns how many times the batch of turnID (in its turn's log)
// moved to started: its log's events named started that follow an event
// of another name. A move to started is the barrier passed, its approved
// calls free to run; no redrive outcome is published for it any more.
func (h *H) Starts(turnID string) int {
	h.T.Helper()
	n, last := 0, ""
	for _, name := range h.LogEvents(turnID) {
		if name == string(schemas.BatchStarted) && last != name {
			n++
		}
		last = name
	}
	return n
}

// LogEvents returns the names of the events in turnID's log, oldest
// first: the batch record's states as each write left it (queued,
// running, awaiting, ...). A batch kept in the batches bucket (an earlier
// version's) has none.
func (h *H) LogEvents(turnID string) []string {
	h.T.Helper()
	p := topology.TurnLogPartition(turnID, len(h.Env.Buckets.TurnLogs))
	prefix := topology.TurnLogSubject(p, turnID, "")
	var names []string
	for _, m := range h.Messages(topology.TurnLogStream(p), topology.TurnLogWildcard(p, turnID)) {
		names = append(names, strings.TrimPrefix(m.Subject, prefix))
	}
	return names
}

// Redrives returns the redrive outcomes of turnID of kind ("*" for all).
func (h *H) Redrives(kind, turnID string) []*schemas.RedriveOutcome {
	h.T.Helper()
	return DecodeAll[schemas.RedriveOutcome](h.T, h.Events(topology.SubjectRedrive+kind+"."+turnID))
}

// WaitRedrives waits until at least n redrive outcomes of kind are stored
// for turnID and returns them all.
func (h *H) WaitRedrives(kind, turnID string, n int) []*schemas.RedriveOutcome {
	h.T.Helper()
	var got []*schemas.RedriveOutcome
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%d redrive %s outcome(s) of %s", n, kind, turnID), func() bool {
		got = h.Redrives(kind, turnID)
		return len(got) >= n
	})
	return got
}

// DLQ returns the dead letters of stage.
func (h *H) DLQ(stage string) []Stored {
	h.T.Helper()
	return h.Messages(topology.StreamDLQ, topology.DLQSubject(stage))
}

// WaitDLQ waits until stage has at least n dead letters and returns them.
func (h *H) WaitDLQ(stage string, n int) []Stored {
	h.T.Helper()
	var got []Stored
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%d dead letter(s) of %s", n, stage), func() bool {
		got = h.DLQ(stage)
		return len(got) >= n
	})
	return got
}

// consumers are the durable consumers of the stages.
var consumers = map[string]topology.ConsumerSpec{
	Ingest:   topology.IngestConsumer(),
	Executor: topology.ExecutorConsumer(),
	Approver: topology.ApproverConsumer(),
	Redriver: topology.RedriverConsumer(),
}

// moreConsumers are a stage's other durable consumers, which WaitIdle
// waits for too.
var moreConsumers = map[string][]topology.ConsumerSpec{
	Redriver: {topology.RedriverNoticesConsumer()},
}

// WaitConsumed waits until stage has acknowledged (or terminated) every
// message of its stream up to and including seq: proof that the stage has
// finished with it. The redriver's stream is the approvals bucket's
// (WaitConsumedIn names another).
func (h *H) WaitConsumed(stage string, seq uint64) {
	h.T.Helper()
	sc, ok := consumers[stage]
	if !ok {
		h.T.Fatalf("pipelinetest: unknown stage %q", stage)
	}
	h.waitConsumed(stage, sc, seq)
}

// WaitConsumedIn is WaitConsumed for stage's consumer on stream (the
// redriver's on TOLLGATE_EVENTS, which takes batch-awaiting notices).
func (h *H) WaitConsumedIn(stage, stream string, seq uint64) {
	h.T.Helper()
	for _, sc := range append([]topology.ConsumerSpec{consumers[stage]}, moreConsumers[stage]...) {
		if sc.Stream == stream {
			h.waitConsumed(stage, sc, seq)
			return
		}
	}
	h.T.Fatalf("pipelinetest: stage %q has no consumer on %s", stage, stream)
}

func (h *H) waitConsumed(stage string, sc topology.ConsumerSpec, seq uint64) {
	h.T.Helper()
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%s consumed up to seq %d", stage, seq), func() bool {
		ctx, cancel := h.Ctx()
		defer cancel()
		c, err := h.JS.Consumer(ctx, sc.Stream, sc.Config.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= seq
	})
}

// WaitIdle waits until each stage's consumer has handled every message
// its filter matched when WaitIdle was called: its ack floor has reached
// the last such message, and nothing is unacknowledged. Nothing pending in
// the consumer's info alone is not enough: the server acknowledges a
// publish before it tells the stream's consumers, so right after a publish
// a consumer can still report nothing pending.
func (h *H) WaitIdle(stages ...string) {
	h.T.Helper()
	for _, stage := range stages {
		sc, ok := consumers[stage]
		if !ok {
			h.T.Fatalf("pipelinetest: unknown stage %q", stage)
		}
		for _, more := range moreConsumers[stage] {
			h.waitIdle(stage, more)
		}
		h.waitIdle(stage, sc)
	}
}

// waitIdle waits until stage's consumer sc has handled every message its
// filter matches now (WaitIdle).
func (h *H) waitIdle(stage string, sc topology.ConsumerSpec) {
	h.T.Helper()
	last := h.lastMatching(sc)
	jstest.EventuallyState(h.T, h.wait, fmt.Sprintf("%s idle on %s (handled up to seq %d)", stage, sc.Stream, last), func() (bool, string) {
		ctx, cancel := h.Ctx()
		defer cancel()
		c, err := h.JS.Consumer(ctx, sc.Stream, sc.Config.Durable)
		if err != nil {
			return false, err.Error()
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		state := fmt.Sprintf("ack floor %d, pending %d, unacked %d", info.AckFloor.Stream, info.NumPending, info.NumAckPending)
		return info.AckFloor.Stream >= last && info.NumPending == 0 && info.NumAckPending == 0, state
	})
}

// lastMatching is the sequence of the last message stored in sc's stream
// that sc's filter matches (0: none).
func (h *H) lastMatching(sc topology.ConsumerSpec) uint64 {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	filters := sc.Config.FilterSubjects
	if sc.Config.FilterSubject != "" {
		filters = append(filters, sc.Config.FilterSubject)
	}
	last, err := jstest.LastMatching(ctx, h.JS, sc.Stream, filters)
	if err != nil {
		h.T.Fatalf("pipelinetest: %v", err)
	}
	return last
}

// Gets collects, on one channel in the order the server routed them, the
// message reads (message gets and direct gets, from any connection) of
// each stream in streams: a KV bucket's stream is "KV_<bucket>". Tests
// count a stage's reads up to a later read of their own (the later-fact
// pattern); the channel holds 4,096 reads, as other stages may read too.
func (h *H) Gets(streams ...string) <-chan *nats.Msg {
	h.T.Helper()
	ch := make(chan *nats.Msg, 4096)
	for _, stream := range streams {
		for _, subj := range []string{"$JS.API.STREAM.MSG.GET." + stream, "$JS.API.DIRECT.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>"} {
			if _, err := h.Env.NC.ChanSubscribe(subj, ch); err != nil {
				h.T.Fatalf("pipelinetest: subscribe %s: %v", subj, err)
			}
		}
	}
	if err := h.Env.NC.Flush(); err != nil {
		h.T.Fatalf("pipelinetest: flush: %v", err)
	}
	return ch
}
