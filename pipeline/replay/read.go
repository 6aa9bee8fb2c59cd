package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Range selects the turns a replay covers by their accepted message on
// TOLLGATE_TURNS (the entry of its session's order,
// tollgate.turn.order.exec.<session key>, or where an earlier version
// published it and where step batches and follow-ups arrive,
// tollgate.turn.accepted.<session key>): its stream time
// within [Since, Until] and its stream sequence within [FromSeq, ToSeq],
// bounds inclusive, a zero bound open. Every selected turn is then replayed
// from all of its events, whenever they were stored: a turn is never cut in
// half by the range.
type Range struct {
	Since, Until   time.Time
	FromSeq, ToSeq uint64
}

// Validate reports a range that selects nothing by construction.
func (r Range) Validate() error {
	switch {
	case !r.Since.IsZero() && !r.Until.IsZero() && r.Until.Before(r.Since):
		return fmt.Errorf("replay: until %s is before since %s", r.Until.Format(time.RFC3339), r.Since.Format(time.RFC3339))
	case r.ToSeq != 0 && r.ToSeq < r.FromSeq:
		return fmt.Errorf("replay: to-seq %d is below from-seq %d", r.ToSeq, r.FromSeq)
	}
	return nil
}

func (r Range) contains(seq uint64, at time.Time) bool {
	return seq >= r.FromSeq && (r.ToSeq == 0 || seq <= r.ToSeq) &&
		!at.Before(r.Since) && (r.Until.IsZero() || !at.After(r.Until))
}

// History is what the streams say about the turns of a Range.
type History struct {
	Turns []*Turn
	// Skipped are stored messages that could not be used (they do not
	// decode, or name another turn than their subject), one line each.
	Skipped []string
}

// Turn is one turn as its accepted message and its events tell it.
type Turn struct {
	TurnID    string
	SessionID string
	Seq       uint64    // TOLLGATE_TURNS sequence of its first accepted message
	Accepted  time.Time // stream time of that message
	// Batch is the batch record KV should hold according to the streams
	// (see Read for which event sets which field).
	Batch *schemas.BatchRecord
	// Approvals are the approval records KV should hold, in call order.
	Approvals []*schemas.ApprovalRecord
	// Notes say what the streams could not tell, or did not use.
	Notes []string

	// what the events said, gathered before projecting
	turn      *schemas.AcceptedTurn
	requested []*schemas.ApprovalRecord
	decided   map[string]*schemas.DecidedEvent
	submitted map[string][]submitted // by approval id, in stream order (judged only without a decided event)
	awaiting  *schemas.TurnNotice    // first awaiting notice with a snapshot
	waited    *schemas.TurnNotice    // first awaiting notice of any kind
	started   *schemas.RedriveOutcome
	outcome   *schemas.TurnOutcome
	logged    bool // outcome is the one its turn log's outcome event keeps
}

func (t *Turn) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// eventSlack is how long before a turn's accepted message its events are
// looked for: events are stored after it, but on a cluster the two streams'
// leaders stamp times with different clocks.
const eventSlack = time.Minute

// eventFilters are the events a turn's records are rebuilt from.
var eventFilters = []string{
	topology.SubjectApprovalRequested + "*",
	topology.SubjectApprovalDecided + "*",
	topology.SubjectBatchAwaiting + "*",
	topology.SubjectRedrive + string(schemas.RedriveStarted) + ".*",
	topology.SubjectTurnOutcome + "*",
}

// Read reads the accepted turns of r from TOLLGATE_TURNS, then the outcome
// events of those turns' logs (TOLLGATE_TURNLOG_<p>) and every event of
// those turns from TOLLGATE_EVENTS, and projects each turn's batch and
// approval records. It reads a snapshot: messages stored after it starts
// are not read. It writes nothing.
//
// The first accepted message of a turn id is the turn (the executor keeps
// the first too). Its batch record: context, text, calls and origin from
// the accepted turn, state queued; awaiting with the approvals and results
// of the executor's awaiting notice; started after a redrive "started"
// event; completed or failed, with code, reason and results, after the turn
// outcome. Each approval record is the first request that binds one of
// the turn's calls (turn, call id, tool, argument digest) and carries the
// turn's TurnContext (the same msgpack encoding), with the status,
// decision and votes of its decision: its revision in the approvals
// bucket's stream (store.DecidedOf), else the decision its batch's
// started event passed on (schemas.BatchRecord.Decided: a decision sent
// to the approver as a request is kept by no other stream), else the
// first decided event published on tollgate.event.approval.decided.<turn>
// (an earlier version's), else, read with ReadJudging, its submitted
// decisions judged again; without any, it is pending. A request is kept by
// the turn log's awaiting event (schemas.BatchRecord.Requested: the
// record its approval-requested event announces, read first), or, for a
// turn whose log keeps none (an earlier version's), published on
// tollgate.event.approval.requested.<turn>. Nothing is re-derived or
// re-sealed: contexts are copied as they were written.
//
// The turn outcome is the one its turn log keeps where the log keeps one:
// the record of its outcome event, tollgate.turnlog.<p>.<turn>.outcome
// (schemas.BatchRecord.Outcome, docs/protocol.md §4.2a). That is every
// batch kept in a turn log, whose outcome is published nowhere. Otherwise
// it is the first one published on tollgate.event.turn.outcome.<turn>: a
// batch kept in tollgate_batches (an earlier version's), one whose ending
// event holds no outcome (an earlier version ended it so), or one whose log
// or turn-log stream is gone. Only one outcome is kept: the log's when
// there is one (a published copy that differs from it is noted), else the
// first published. A missing turn-log stream, or all of them, is no error:
// its turns' outcomes are their published copies (Run warns about it).
//
// The outcome events are read as the events are: one scan per turn-log
// partition (filter tollgate.turnlog.<p>.*.outcome) from the earliest
// accepted turn, less eventSlack, rather than a read of each turn's last
// event. A range of many turns then costs a consumer per partition, not a
// request per turn; the scan reads the outcome of every turn ended since
// that time, selected or not (one message per turn), fewer messages than
// the events scan over the same time, which reads several per turn.
//
// Times the stages took from their own clock and published nowhere are
// approximated: a batch's created_at is its accepted message's stream
// time, its updated_at the time of the last event that set its state.
func Read(ctx context.Context, js jetstream.JetStream, r Range) (*History, error) {
	return read(ctx, js, r, nil)
}

// Judge is what the approver judged decisions with: Read re-judges an
// approval's submitted decisions with it where no stream keeps its
// decision (see ReadJudging).
type Judge struct {
	Policy *policy.Policy
	Keys   *seal.KeyRing
}

// ReadJudging is Read, and where neither the approvals bucket's stream nor
// a published decided event keeps an approval's decision (the bucket was
// lost: its stream with it), it judges the decisions submitted on it
// (TOLLGATE_DECISIONS, tollgate.decision.submit.<transport>.<approval>)
// again, in stream order, as the approver did: approver.Authorize, pure,
// with j's policy and keys and the decision message's stream time for
// now. So a decision the approver applied comes back, with its votes, at
// the time it was submitted (the approver's clock, a moment later, is in
// no stream); one the policy now refuses leaves the approval pending,
// which fails safe (a person decides again). An approval that expired
// unanswered, which no decision names, comes back pending past its
// expiry, and the approver expires it again.
func ReadJudging(ctx context.Context, js jetstream.JetStream, r Range, j *Judge) (*History, error) {
	return read(ctx, js, r, j)
}

func read(ctx context.Context, js jetstream.JetStream, r Range, j *Judge) (*History, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	h := &History{}
	byID := map[string]*Turn{}
	start := startAt{seq: r.FromSeq, time: r.Since}
	err := scan(ctx, js, topology.StreamTurns, []string{topology.OrderFilter(topology.OrderExec), topology.SubjectTurnAccepted + "*"}, start, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		seq := meta.Sequence.Stream
		if (r.ToSeq != 0 && seq > r.ToSeq) || (!r.Until.IsZero() && meta.Timestamp.After(r.Until)) {
			return false, nil
		}
		if !r.contains(seq, meta.Timestamp) {
			return true, nil
		}
		at, err := schemas.Decode[schemas.AcceptedTurn](m.Data())
		if err != nil {
			h.skip(m.Subject(), seq, err)
			return true, nil
		}
		if !schemas.ValidKey(at.TurnID) {
			h.skip(m.Subject(), seq, fmt.Errorf("turn id %q is not a valid key", at.TurnID))
			return true, nil
		}
		if t := byID[at.TurnID]; t != nil {
			t.note("accepted again at %s seq %d: the first accepted message is the turn", topology.StreamTurns, seq)
			return true, nil
		}
		t := &Turn{TurnID: at.TurnID, Seq: seq, Accepted: meta.Timestamp.UTC(), turn: at,
			decided: map[string]*schemas.DecidedEvent{}, submitted: map[string][]submitted{}}
		if at.Context != nil {
			t.SessionID = at.Context.SessionID
		}
		byID[at.TurnID] = t
		h.Turns = append(h.Turns, t)
		return true, nil
	})
	if err != nil || len(h.Turns) == 0 {
		return h, err
	}

	from := h.Turns[0].Accepted
	for _, t := range h.Turns {
		from = minTime(from, t.Accepted)
	}
	since := startAt{time: from.Add(-eventSlack)}
	if err := h.logEvents(ctx, js, byID, since); err != nil {
		return nil, err
	}
	err = scan(ctx, js, topology.StreamEvents, eventFilters, since, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		subj := m.Subject()
		t := byID[subj[strings.LastIndexByte(subj, '.')+1:]]
		if t == nil {
			return true, nil // another turn's
		}
		if strings.HasPrefix(m.Headers().Get(jetstream.MsgIDHeader), topology.ReplayNoticePrefix) {
			return true, nil // a rebuild's nudge: it says nothing about the batch
		}
		if err := t.add(subj, m.Data()); err != nil {
			h.skip(subj, meta.Sequence.Stream, err)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if err := h.bucketDecisions(ctx, js, byID); err != nil {
		return nil, err
	}
	if j != nil {
		if err := h.submittedDecisions(ctx, js, byID, since); err != nil {
			return nil, err
		}
	}
	for _, t := range h.Turns {
		t.project(j)
	}
	return h, nil
}

// bucketDecisions sets the decision of each approval of byID's turns that
// the approvals bucket's stream holds (store.DecidedOf of each stored
// revision; the bucket keeps one per approval): the decision itself, so
// it is taken over a published copy. A missing bucket is passed over.
func (h *History) bucketDecisions(ctx context.Context, js jetstream.JetStream, byID map[string]*Turn) error {
	err := scan(ctx, js, topology.StreamApprovals, []string{topology.ApprovalRevisions}, startAt{}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		t := byID[schemas.TurnIDOfApproval(strings.TrimPrefix(m.Subject(), topology.ApprovalRevisionPrefix))]
		if t == nil {
			return true, nil // another turn's
		}
		ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
		switch {
		case err != nil:
			h.skip(m.Subject(), meta.Sequence.Stream, err)
		case ev != nil && ev.TurnID != t.TurnID:
			h.skip(m.Subject(), meta.Sequence.Stream, fmt.Errorf("approval %s names turn %s", ev.ApprovalID, ev.TurnID))
		case ev != nil:
			t.decided[ev.ApprovalID] = ev
		}
		return true, nil
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // the bucket is lost: see submittedDecisions
	}
	return err
}

// submitted is a decision as TOLLGATE_DECISIONS keeps it, with its stream
// time.
type submitted struct {
	d  *schemas.Decision
	at time.Time
}

// submittedDecisions gathers the decisions submitted on the approvals of
// byID's turns from start (ReadJudging), in stream order.
func (h *History) submittedDecisions(ctx context.Context, js jetstream.JetStream, byID map[string]*Turn, start startAt) error {
	return scan(ctx, js, topology.StreamDecisions, []string{topology.SubjectDecisionSubmit + ">"}, start, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		subj := m.Subject()
		id := subj[strings.LastIndexByte(subj, '.')+1:]
		t := byID[schemas.TurnIDOfApproval(id)]
		if t == nil {
			return true, nil // another turn's, or a grant's revocation
		}
		d, err := schemas.Decode[schemas.Decision](m.Data())
		switch {
		case err != nil:
			h.skip(subj, meta.Sequence.Stream, err)
		case subj != topology.DecisionSubject(d.Transport, d.ApprovalID):
			// The approver refuses it so (INVALID_INPUT): never applied.
			h.skip(subj, meta.Sequence.Stream, fmt.Errorf("decision %s of approval %s from transport %s arrived on another subject", d.DecisionID, d.ApprovalID, d.Transport))
		default:
			t.submitted[id] = append(t.submitted[id], submitted{d: d, at: meta.Timestamp.UTC()})
		}
		return true, nil
	})
}

// judged is approval a (as requested) after the decisions submitted on it
// are judged again in order (ReadJudging), and whether any changed it.
func (t *Turn) judged(a *schemas.ApprovalRecord, j *Judge) (*schemas.ApprovalRecord, bool) {
	rec, changed := a, false
	for _, s := range t.submitted[a.ApprovalID] {
		v, _ := approver.Authorize(rec, s.d, j.Policy, j.Keys, s.at)
		if v.Next != nil {
			rec, changed = v.Next, true
		}
	}
	return rec, changed
}

func (h *History) skip(subject string, seq uint64, err error) {
	h.Skipped = append(h.Skipped, fmt.Sprintf("%s seq %d: %v", subject, seq, err))
}

// logEvents sets the outcome of each turn of byID whose log keeps one,
// and gathers the approvals its awaiting events requested and the
// decisions its started events passed on (see Read): it scans every
// turn-log partition's outcome, awaiting and started events from
// start. An event in another partition than its turn's (where no stage
// reads it), or whose record does not decode, is another turn's or names
// another turn in its outcome, is skipped; one whose record holds no
// outcome (store.ErrNoOutcome) is passed over, leaving the turn to its
// published outcome, as is an awaiting event that requested nothing
// (an earlier version's, whose requests were published). A missing
// turn-log stream is passed over too.
func (h *History) logEvents(ctx context.Context, js jetstream.JetStream, byID map[string]*Turn, start startAt) error {
	logs, _, err := turnLogStreams(ctx, js)
	if err != nil {
		return err
	}
	for i, s := range logs {
		if s == nil {
			continue // missing: its turns' outcomes are their published copies
		}
		name := s.CachedInfo().Config.Name
		filters := []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i), topology.TurnLogStartedFilter(i)}
		err := scan(ctx, js, name, filters, start, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
			subj := m.Subject()
			_, turn, event, ok := topology.ParseTurnLogSubject(subj)
			t := byID[turn]
			if !ok || t == nil {
				return true, nil // another turn's
			}
			if p := topology.TurnLogPartition(turn, len(logs)); p != i {
				h.skip(subj, meta.Sequence.Stream, fmt.Errorf("turn %s's log is partition %d's, not %s", turn, p, name))
				return true, nil
			}
			if event == store.EventAwaiting {
				reqs, err := store.DecodeRequested(turn, m.Data())
				if err != nil {
					h.skip(subj, meta.Sequence.Stream, err)
				}
				t.requested = append(t.requested, reqs...)
				return true, nil
			}
			if event == topology.EventTurnStarted {
				// The decisions its barrier passed on: the approvals
				// bucket's revisions, where it is kept, say the same.
				decided, err := store.DecodeDecided(turn, m.Data())
				if err != nil {
					h.skip(subj, meta.Sequence.Stream, err)
				}
				for _, d := range decided {
					if t.decided[d.ApprovalID] == nil {
						t.decided[d.ApprovalID] = d
					}
				}
				return true, nil
			}
			o, err := store.DecodeOutcome(turn, m.Data())
			switch {
			case errors.Is(err, store.ErrNoOutcome):
				return true, nil // an earlier version's ending event: its published outcome is the outcome
			case err == nil && o.TurnID != turn:
				err = fmt.Errorf("outcome names turn %s", o.TurnID)
			}
			if err != nil {
				h.skip(subj, meta.Sequence.Stream, err)
				return true, nil
			}
			if t.outcome == nil {
				t.outcome, t.logged = o, true
			} else {
				t.note("its log holds another outcome event at %s seq %d: the first is kept", name, meta.Sequence.Stream)
			}
			return true, nil
		})
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			// deleted since it was bound: as a missing stream
		case err != nil:
			return err
		}
	}
	return nil
}

// sameOutcome reports whether a and b encode to the same bytes (the
// published copy of a logged outcome is byte for byte the log's).
func sameOutcome(a, b *schemas.TurnOutcome) bool {
	x, xerr := schemas.Encode(a)
	y, yerr := schemas.Encode(b)
	return xerr == nil && yerr == nil && bytes.Equal(x, y)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// add records one event of t. The turn id in the payload must be the one
// in the subject.
func (t *Turn) add(subject string, data []byte) error {
	_, rec, err := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided,
		topology.RouteBatchAwaiting, topology.RouteRedrive, topology.RouteTurnOutcome)
	if errors.Is(err, topology.ErrUnrouted) {
		return nil
	} else if err != nil {
		return err
	}
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		a := rec
		if a.TurnID != t.TurnID {
			return fmt.Errorf("approval %s names turn %s", a.ApprovalID, a.TurnID)
		}
		t.requested = append(t.requested, a)
	case *schemas.DecidedEvent:
		d := rec
		if d.TurnID != t.TurnID {
			return fmt.Errorf("decided event of %s names turn %s", d.ApprovalID, d.TurnID)
		}
		if first := t.decided[d.ApprovalID]; first == nil {
			t.decided[d.ApprovalID] = d
		} else if first.Status != d.Status {
			t.note("approval %s: a later decided event says %s, the first %s: the first is kept", d.ApprovalID, d.Status, first.Status)
		}
	case *schemas.TurnNotice:
		n := rec
		if n.TurnID != t.TurnID || n.Kind != schemas.NoticeAwaiting {
			return fmt.Errorf("notice %s for turn %s on an awaiting subject", n.Kind, n.TurnID)
		}
		if t.waited == nil {
			t.waited = n
		}
		if t.awaiting == nil && n.Approvals != nil {
			t.awaiting = n
		}
	case *schemas.RedriveOutcome:
		o := rec
		if o.TurnID != t.TurnID {
			return fmt.Errorf("redrive outcome names turn %s", o.TurnID)
		}
		if t.started == nil && o.Kind == schemas.RedriveStarted {
			t.started = o
		}
	case *schemas.TurnOutcome:
		o := rec
		if o.TurnID != t.TurnID {
			return fmt.Errorf("outcome names turn %s", o.TurnID)
		}
		switch {
		case t.outcome == nil:
			t.outcome = o
		case t.logged && !sameOutcome(t.outcome, o):
			t.note("a published outcome (%s, %s) differs from the one its turn log keeps (%s, %s): the log's is kept", o.State, o.Code, t.outcome.State, t.outcome.Code)
		}
	}
	return nil
}

// project builds t.Batch and t.Approvals from what add gathered, judging
// submitted decisions again with j where no decided event was found (nil:
// none judged).
func (t *Turn) project(j *Judge) {
	at := t.turn
	n := len(at.Calls)
	b := &schemas.BatchRecord{
		V: schemas.BatchVersion, TurnID: at.TurnID, SessionID: t.SessionID, Context: at.Context, Text: at.Text,
		Calls: at.Calls, Origin: at.Origin, FollowUpDepth: at.FollowUpDepth, State: schemas.BatchQueued,
		Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n),
		CreatedAt: t.Accepted, UpdatedAt: t.Accepted,
	}
	switch s := t.awaiting; {
	case s != nil && len(s.Approvals) == n:
		b.State, b.UpdatedAt = schemas.BatchAwaiting, s.At
		copy(b.Approvals, s.Approvals)
		copy(b.Results, s.Results)
	case t.waited != nil:
		// An awaiting notice from before notices carried the snapshot:
		// the approvals are those requested; the results of calls that
		// did not wait are in no event until the outcome. The redriver
		// never runs a call without an approval, so they stay empty.
		b.State, b.UpdatedAt = schemas.BatchAwaiting, t.waited.At
		if s != nil {
			t.note("awaiting notice has %d approvals for %d calls: not used", len(s.Approvals), n)
		}
		t.note("no awaiting snapshot: results of calls that did not wait for approval are unknown until the outcome")
	}
	if t.started != nil {
		b.State, b.UpdatedAt = schemas.BatchStarted, t.started.At
	}
	legacy := t.waited != nil && t.awaiting == nil
	if o := t.outcome; o != nil {
		b.State, b.Code, b.Reason, b.UpdatedAt = schemas.BatchCompleted, o.Code, o.Reason, o.FinishedAt
		if o.State == schemas.TurnFailed {
			b.State = schemas.BatchFailed
		}
		for _, r := range o.Results {
			i := slices.IndexFunc(at.Calls, func(c schemas.ToolCall) bool { return c.CallID == r.CallID })
			if i < 0 {
				t.note("outcome has a result for %s, not a call of the turn: not used", r.CallID)
				continue
			}
			b.Results[i] = &r
		}
	}
	switch {
	case legacy:
		// Only a version before 2 published awaiting notices without the
		// snapshot: its claims are records of tollgate_claims.
		b = schemas.AsLegacyBatch(b)
	case b.State == schemas.BatchStarted:
		claimUnfinished(b) // its approved calls may have run
	}
	t.Batch = b

	want := schemas.ContextDigest(at.Context)
	have := map[string]bool{}
	for _, a := range t.requested {
		if have[a.ApprovalID] {
			continue
		}
		i := slices.IndexFunc(at.Calls, func(c schemas.ToolCall) bool { return c.CallID == a.CallID })
		switch {
		case i < 0 || a.ApprovalID != schemas.ApprovalID(t.TurnID, i) || a.Tool != at.Calls[i].Tool || a.ArgsDigest != at.Calls[i].ArgsDigest:
			t.note("approval-requested event for %s does not bind a call of the turn: not used", a.ApprovalID)
			continue
		case a.Context == nil || schemas.ContextDigest(a.Context) != want:
			t.note("approval-requested event for %s carries another TurnContext than the turn's: not used", a.ApprovalID)
			continue
		}
		have[a.ApprovalID] = true
		if t.waited != nil && t.awaiting == nil {
			b.Approvals[i] = a.ApprovalID
		}
		if d := t.decided[a.ApprovalID]; d != nil {
			a = a.Decided(d)
		} else if j != nil {
			var changed bool
			if a, changed = t.judged(a, j); changed {
				t.note("approval %s: no stream keeps its decision; its submitted decisions were judged again: %s", a.ApprovalID, a.Status)
			}
		}
		t.Approvals = append(t.Approvals, a)
	}
	slices.SortFunc(t.Approvals, func(x, y *schemas.ApprovalRecord) int { return strings.Compare(x.CallID, y.CallID) })
	for id := range t.decided {
		if !have[id] {
			t.note("decided event for %s without a usable approval-requested event: not used", id)
		}
	}
}

// startAt is where a scan starts: a stream sequence, a time, or (both
// zero) the first message.
type startAt struct {
	seq  uint64
	time time.Time
}

// scan calls fn with every message of stream matching filters from start,
// in stream order, up to the last one stored when the scan began, until fn
// returns false. It reads through an ephemeral consumer that acks nothing
// and is deleted afterwards.
func scan(ctx context.Context, js jetstream.JetStream, stream string, filters []string, start startAt, fn func(jetstream.Msg, *jetstream.MsgMetadata) (bool, error)) error {
	cfg := jetstream.ConsumerConfig{
		FilterSubjects: filters, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: time.Minute, MemoryStorage: true,
	}
	switch {
	case start.seq > 0: // with a time too, the caller filters by time
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start.seq
	case !start.time.IsZero():
		t := start.time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("replay: read %s: %w", stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
	}()
	left := cons.CachedInfo().NumPending
	for left > 0 {
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("replay: read %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			left--
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("replay: read %s: %w", stream, err)
			}
			more, err := fn(m, meta)
			if err != nil || !more {
				return err
			}
			if meta.NumPending == 0 {
				left = 0
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("replay: read %s: %w", stream, err)
		}
		if got == 0 {
			break // the rest aged out of the stream while we read
		}
	}
	return nil
}

// RebuildWorker is the worker named on the claims a rebuilt batch record
// carries (claimUnfinished).
const RebuildWorker = "tollgate-replay:rebuilt"

// claimUnfinished gives every call of b without a result, a batch rebuilt
// from the streams that may have been running its calls, a claim as of its
// last event (b.UpdatedAt). A version 2 batch keeps its calls' claims in
// its record, which the streams do not hold, so a call that was claimed
// (and may have run) cannot be told from one that was not. Which batches
// may have been running their calls: a started one (its approved calls),
// and a queued one whose session may have been running it (see
// applier.batchToWrite); never an awaiting one, whose calls that did not
// wait have their results in the awaiting notice and whose calls that wait
// are claimed only once it starts. Its stages then report such a call
// needs_attention EXECUTION_UNCERTAIN once the claim lease has passed, and
// never run it (a retry-safe tool's claim is taken over and the call run
// again). It is the safe side of a lost bucket: a call that never ran may
// be reported uncertain, no call runs twice. When the record is still in
// KV, its own claims are kept instead (mergeBatch).
func claimUnfinished(b *schemas.BatchRecord) {
	for i := range b.Calls {
		if b.Results[i] == nil {
			b.SetClaim(i, &schemas.CallClaim{Worker: RebuildWorker, ClaimedAt: b.UpdatedAt})
		}
	}
}
