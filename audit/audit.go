// Package audit reads the record of what Tollgate decided and did from its
// streams, the system's record: turns accepted (TOLLGATE_TURNS), approvals
// requested and decided, refused decisions, redrives, each call's result
// and the turn outcomes (TOLLGATE_EVENTS), and each batch's moves from
// state to state (its turn's log, TOLLGATE_TURNLOG_<i>), as one timeline.
// `tollgate audit`, and the web inbox's turn and history pages and its
// JSON-lines export, are read with it.
//
// A turn's log holds its batch record after each write (issue 36): the
// move to awaiting is the fact that the turn waits for its approvals, the
// move to started that its approvals were all decided and its calls are
// free to run. Neither is published on TOLLGATE_EVENTS any more
// (batch.awaiting, redrive.started), so the timeline has them from the log,
// as Batch events. A turn of an earlier version has no log: its batch is in
// KV bucket tollgate_batches, and its timeline has the redrive.started
// events that version published instead.
package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Kinds of Event.
const (
	Accepted  = "accepted"  // a turn accepted by ingest (TOLLGATE_TURNS)
	Requested = "requested" // an approval requested
	Decided   = "decided"   // an approval left pending: approved, denied, expired or abandoned
	Rejected  = "rejected"  // a decision the approver refused
	Redrive   = "redrive"   // a redrive attempt: deferred or failed (started: earlier versions)
	Batch     = "batch"     // the batch moved to another state, in its turn's log (Status)
	Result    = "result"    // one call's result, from its turn's outcome
	Outcome   = "outcome"   // a turn's outcome
)

// Event is one line of the audit: a stored message, or one call's
// result in a turn outcome (which shares its outcome's time and sequence).
// Kind says which of the optional fields are set.
type Event struct {
	Time   time.Time `json:"time"` // stream time of the message
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	Kind   string    `json:"kind"`

	TurnID     string `json:"turn_id,omitempty"`
	SessionID  string `json:"session_id,omitempty"`
	ApprovalID string `json:"approval_id,omitempty"`
	CallID     string `json:"call_id,omitempty"`
	// Requester is whose turn it is, where the messages read say so.
	Requester string `json:"requester,omitempty"`
	// Principal is who acted: the decider (decided; tollgate:expiry and
	// the like for expiry and abandon), the refused decider (rejected).
	// The requester of an accepted turn is in Requester.
	Principal string `json:"principal,omitempty"`

	// accepted: where the turn came from and who it may answer.
	Transport string `json:"transport,omitempty"`
	Channel   string `json:"channel,omitempty"` // kind/id
	Audience  string `json:"audience,omitempty"`
	Calls     int    `json:"calls,omitempty"`
	Origin    string `json:"origin,omitempty"` // follow-up work: the call that scheduled it

	// requested: the call the approval binds and what it offers.
	Tool       string     `json:"tool,omitempty"`
	ArgsDigest string     `json:"args_digest,omitempty"`
	Options    []string   `json:"options,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	Quorum     int        `json:"quorum,omitempty"`

	// Status is the approval's status (decided), the redrive's kind, the
	// call's result status, the batch's state (batch: queued, running,
	// awaiting, started, completed, failed) or the turn's state (outcome).
	Status    string   `json:"status,omitempty"`
	Option    string   `json:"option,omitempty"`
	Assurance int      `json:"assurance,omitempty"`
	Votes     []string `json:"votes,omitempty"` // decided: quorum votes, by principal
	// Note is the decider's note kept with the decision (decided: a deny
	// reason, an approve comment; schemas.DecisionInfo.Note), as sent: data
	// to show (escaped), never an instruction.
	Note       string `json:"note,omitempty"`
	DecisionID string `json:"decision_id,omitempty"`
	// Repeat is, on a decided event that answered a decision repeating the
	// recorded outcome (schemas.DecidedEvent.Repeat), that decision's id.
	Repeat  string `json:"repeat,omitempty"`
	Code    string `json:"code,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Trigger string `json:"trigger,omitempty"` // redrive
	Pending int    `json:"pending,omitempty"` // redrive deferred; batch awaiting: the approvals it waits for
	Results int    `json:"results,omitempty"` // outcome; batch completed or failed

	// result: how the call's approval was decided, and by whom (the
	// decision's principal and the quorum votes), from its decided event.
	ApprovalStatus string   `json:"approval_status,omitempty"`
	DecidedBy      []string `json:"decided_by,omitempty"`

	// Record is the approval as requested (requested events only): its
	// TurnContext says who may see and decide it.
	Record *schemas.ApprovalRecord `json:"-"`
}

// Query selects the events audit prints. Every filter given must hold.
type Query struct {
	Turn, Approval, Principal string
	// Tool and Session select the events of approvals and calls of that
	// tool, and of turns of that session.
	Tool, Session string
	Since, Until  time.Time
}

// Read reads the events q selects from TOLLGATE_EVENTS and (unless q
// is about one approval) the accepted turns from TOLLGATE_TURNS and the
// batches' moves from the turn logs (readTurnLogs), and the turns'
// outcomes from the turn logs' outcome events (a published outcome is
// read only for a turn whose log does not hold it: its batch kept in
// tollgate_batches, or ended by an earlier version), stored within
// [q.Since, q.Until], up to each stream's last message when it started. It
// returns them oldest first: each stream in its order, the streams merged
// by stream time. Messages it cannot decode are logged and left out.
func Read(ctx context.Context, js jetstream.JetStream, q Query, log *slog.Logger) ([]Event, error) {
	var events, turns, moves []Event
	sessions := map[string]string{} // turn id -> session id
	keys := map[string]string{}     // turn id -> session key, from a requested event's context
	err := readStream(ctx, js, topology.StreamEvents, filters(q), q.Since, q.Until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
		at := Event{Time: meta.Timestamp.UTC(), Stream: topology.StreamEvents, Seq: meta.Sequence.Stream}
		es, session, err := decodeEvent(at, m.Subject(), m.Data())
		if err != nil {
			log.Warn("audit: skipped an undecodable event", "subject", m.Subject(), "seq", meta.Sequence.Stream, "err", err)
			return
		}
		if session != "" && len(es) > 0 {
			sessions[es[0].TurnID] = session
			if rec := es[0].Record; rec != nil && rec.Context != nil {
				keys[es[0].TurnID] = schemas.SessionKeyOf(rec.Context)
			}
		}
		events = append(events, es...)
	})
	if err != nil {
		return nil, err
	}
	// Each approval's decision is its record's revision in the approvals
	// bucket that holds it decided.
	decided := map[string]bool{} // approval id -> the bucket holds its decision
	err = readStream(ctx, js, topology.StreamApprovals, revisionFilters(q), q.Since, q.Until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
		ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			log.Warn("audit: skipped an undecodable approval record", "subject", m.Subject(), "seq", meta.Sequence.Stream, "err", err)
			return
		}
		if ev == nil {
			return
		}
		at := Event{Time: meta.Timestamp.UTC(), Stream: topology.StreamApprovals, Seq: meta.Sequence.Stream}
		events = append(events, decidedEvent(at, ev))
		sessions[ev.TurnID] = ev.SessionID
		decided[ev.ApprovalID] = true
	})
	if err != nil {
		return nil, err
	}
	// A batch's moves are the turn's, never an approval's; an approval's
	// call's result is in its turn's outcome.
	logged := map[string]bool{} // turn id, or approval id -> its log holds its outcome, or its request
	if moves, err = readTurnLogs(ctx, js, q, sessions, keys, logged, log); err != nil {
		return nil, err
	}
	// A turn's outcome, an approval's request and its decision are told
	// once: from the turn's log and the approvals bucket, where this
	// version keeps them; a published copy only where they do not hold it
	// (an earlier version's, whose record has left the bucket). A decided
	// event that answered a repeated decision (Repeat) is its own event.
	events = slices.DeleteFunc(events, func(e Event) bool {
		return (e.Kind == Outcome || e.Kind == Result) && logged[e.TurnID] || e.Kind == Requested && logged[e.ApprovalID] ||
			e.Kind == Decided && e.Stream == topology.StreamEvents && e.Repeat == "" && decided[e.ApprovalID]
	})
	slices.SortStableFunc(events, func(a, b Event) int { return a.Time.Compare(b.Time) })
	if q.Approval == "" {
		// The turns stream is keyed by session, not turn: a turn's own
		// session key narrows the read when one of its requested events or
		// its batch carried its context. A turn is accepted into its
		// session's order; an earlier version published it on the
		// accepted subject.
		filters := []string{topology.OrderFilter(topology.OrderExec), topology.SubjectTurnAccepted + "*"}
		if k := keys[q.Turn]; q.Turn != "" && k != "" {
			filters = []string{topology.OrderSubject(topology.OrderExec, k), topology.AcceptedSubject(k)}
		}
		err = readStream(ctx, js, topology.StreamTurns, filters, q.Since, q.Until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
			t, err := schemas.Decode[schemas.AcceptedTurn](m.Data())
			if err != nil {
				log.Warn("audit: skipped an undecodable event", "subject", m.Subject(), "seq", meta.Sequence.Stream, "err", err)
				return
			}
			if q.Turn != "" && t.TurnID != q.Turn {
				return
			}
			e := Event{Time: meta.Timestamp.UTC(), Stream: topology.StreamTurns, Seq: meta.Sequence.Stream,
				Kind: Accepted, TurnID: t.TurnID, Calls: len(t.Calls), Origin: t.Origin}
			if t.Context != nil {
				e.SessionID = t.Context.SessionID
			}
			if tc := t.Context; tc != nil {
				e.Requester, e.Transport, e.Audience = tc.Requester.Principal, tc.Transport, string(tc.Audience)
				e.Channel = string(tc.Channel.Kind) + "/" + tc.Channel.ID
			}
			turns = append(turns, e)
		})
		if err != nil {
			return nil, err
		}
	}
	all := mergeByTime(mergeByTime(turns, events), moves)
	annotate(all, sessions)
	return slices.DeleteFunc(all, func(e Event) bool { return !q.Matches(e) }), nil
}

// filters are the TOLLGATE_EVENTS subjects q needs: the ids are in
// the subjects, so a turn's or an approval's events are read alone.
// Awaiting notices are control messages and not read (the move to
// awaiting is in the turn's log).
func filters(q Query) []string {
	turn := q.Turn
	if q.Approval != "" {
		turn = schemas.TurnIDOfApproval(q.Approval)
	}
	if turn == "" {
		return []string{
			topology.SubjectApprovalRequested + "*", topology.SubjectApprovalDecided + "*",
			topology.SubjectDecisionRejected + "*", topology.SubjectRedrive + "*.*", topology.SubjectTurnOutcome + "*",
		}
	}
	f := []string{
		topology.EventSubject(topology.SubjectApprovalRequested, turn), topology.EventSubject(topology.SubjectApprovalDecided, turn),
		topology.EventSubject(topology.SubjectTurnOutcome, turn),
	}
	if q.Approval != "" {
		return append(f, topology.EventSubject(topology.SubjectDecisionRejected, q.Approval))
	}
	f = append(f, topology.SubjectRedrive+"*."+turn)
	for i := 0; i < schemas.MaxCalls; i++ { // rejections are keyed by approval id
		f = append(f, topology.EventSubject(topology.SubjectDecisionRejected, schemas.ApprovalID(turn, i)))
	}
	return f
}

// decodeEvent turns the event stored on subject into audit events
// stamped like at (a turn outcome becomes one per result, then itself) and
// returns the session the event names, if any.
func decodeEvent(at Event, subject string, data []byte) ([]Event, string, error) {
	_, rec, err := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided,
		topology.RouteDecisionRejected, topology.RouteRedrive, topology.RouteTurnOutcome)
	if errors.Is(err, topology.ErrUnrouted) {
		return nil, "", fmt.Errorf("not an audited subject")
	} else if err != nil {
		return nil, "", err
	}
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		return []Event{requestedEvent(at, rec)}, rec.SessionID, nil
	case *schemas.DecidedEvent:
		return []Event{decidedEvent(at, rec)}, rec.SessionID, nil
	case *schemas.DecisionRejected:
		r := rec
		e := at
		e.Kind, e.TurnID, e.ApprovalID, e.Principal = Rejected, schemas.TurnIDOfApproval(r.ApprovalID), r.ApprovalID, r.Principal
		e.DecisionID, e.Code, e.Reason = r.DecisionID, string(r.Code), r.Reason
		return []Event{e}, "", nil
	case *schemas.RedriveOutcome:
		o := rec
		e := at
		e.Kind, e.TurnID, e.Status, e.Code, e.Reason = Redrive, o.TurnID, string(o.Kind), string(o.Code), o.Reason
		e.Trigger, e.Pending = o.Trigger, o.Pending
		return []Event{e}, "", nil
	case *schemas.TurnOutcome:
		return outcomeEvents(at, rec), rec.SessionID, nil
	}
	return nil, "", fmt.Errorf("not an audited subject")
}

// decidedEvent is the audit event of decision d, stamped like at.
func decidedEvent(at Event, d *schemas.DecidedEvent) Event {
	e := at
	e.Kind, e.TurnID, e.ApprovalID, e.Status, e.Repeat = Decided, d.TurnID, d.ApprovalID, string(d.Status), d.Repeat
	if d.Decision != nil {
		e.Principal, e.Option, e.Assurance, e.DecisionID = d.Decision.Principal, d.Decision.Option, int(d.Decision.Assurance), d.Decision.DecisionID
		e.Note = d.Decision.Note
	}
	for _, v := range d.Votes {
		e.Votes = append(e.Votes, v.Principal)
	}
	return e
}

// revisionFilters are the approvals bucket's subjects q needs: one
// approval's, a turn's approvals' (by their ids: schemas.ApprovalID), or
// every approval's.
func revisionFilters(q Query) []string {
	switch {
	case q.Approval != "":
		return []string{topology.ApprovalRevisionSubject(q.Approval)}
	case q.Turn != "":
		var f []string
		for i := 0; i < schemas.MaxCalls; i++ {
			f = append(f, topology.ApprovalRevisionSubject(schemas.ApprovalID(q.Turn, i)))
		}
		return f
	}
	return []string{topology.ApprovalRevisions}
}

// requestedEvent is the audit event of approval a's request, stamped like
// at.
func requestedEvent(at Event, a *schemas.ApprovalRecord) Event {
	e := at
	e.Kind, e.TurnID, e.ApprovalID, e.CallID, e.Record = Requested, a.TurnID, a.ApprovalID, a.CallID, a
	e.Tool, e.ArgsDigest, e.Options, e.Quorum = a.Tool, a.ArgsDigest, a.Options, a.Quorum
	if !a.ExpiresAt.IsZero() {
		t := a.ExpiresAt.UTC()
		e.ExpiresAt = &t
	}
	if a.Context != nil {
		e.Requester = a.Context.Requester.Principal
	}
	return e
}

// outcomeEvents are the audit events of a turn's outcome, stamped like at:
// one Result per result, then the Outcome.
func outcomeEvents(at Event, o *schemas.TurnOutcome) []Event {
	var out []Event
	for _, r := range o.Results {
		e := at
		e.Kind, e.TurnID, e.CallID, e.ApprovalID, e.Tool = Result, o.TurnID, r.CallID, r.ApprovalID, r.Tool
		e.Status, e.Code, e.Reason = string(r.Status), string(r.Code), r.Reason
		out = append(out, e)
	}
	e := at
	e.Kind, e.TurnID, e.Status, e.Code, e.Reason, e.Results = Outcome, o.TurnID, string(o.State), string(o.Code), o.Reason, len(o.Results)
	return append(out, e)
}

// readTurnLogs reads the batches' moves that q selects from the turn logs:
// one Batch event per move of a turn's batch to another state, at the
// stream time and sequence of the first write that left it there (a
// batch's writes in one state, such as a started batch's claims and
// results, are one move), after the move to awaiting a Requested event
// per approval it requested (schemas.BatchRecord.Requested; each approval
// id goes to logged), and after the move that ends it the turn's outcome
// (outcomeEvents of the record's outcome; its turn goes to logged). Only
// q.Turn's partition and subjects are read when q names a turn; only the
// awaiting and outcome events of its turn when q names an approval. A turn's first event within [q.Since, q.Until] is a
// move, whatever the state before it. Each batch's session, and its
// session key, go to sessions and keys (turn id -> value) where not known
// yet. A server provisioned before the turn logs has none: no events.
func readTurnLogs(ctx context.Context, js jetstream.JetStream, q Query, sessions, keys map[string]string, logged map[string]bool, log *slog.Logger) ([]Event, error) {
	logs, err := topology.OpenTurnLogs(ctx, js)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the turn logs: %w", err)
	}
	parts := make([]int, len(logs))
	for i := range parts {
		parts[i] = i
	}
	turn := q.Turn
	if q.Approval != "" {
		turn = schemas.TurnIDOfApproval(q.Approval)
	}
	if turn != "" {
		parts = []int{topology.TurnLogPartition(turn, len(logs))}
	}
	var all []Event
	for _, i := range parts {
		filter := []string{topology.SubjectTurnLogPrefix + strconv.Itoa(i) + ".>"}
		switch {
		case q.Approval != "": // its turn's request and outcome alone
			filter = []string{topology.TurnLogSubject(i, turn, topology.EventTurnAwaiting), topology.TurnLogSubject(i, turn, topology.EventTurnOutcome)}
		case turn != "":
			filter = []string{topology.TurnLogWildcard(i, turn)}
		}
		var moves []Event
		state := map[string]schemas.BatchState{} // turn id -> its batch's state as last read
		stream := topology.TurnLogStream(i)
		err := readStream(ctx, js, stream, filter, q.Since, q.Until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
			b, err := schemas.DecodeBatch(m.Data())
			if err != nil {
				log.Warn("audit: skipped an undecodable event", "subject", m.Subject(), "seq", meta.Sequence.Stream, "err", err)
				return
			}
			at := Event{Time: meta.Timestamp.UTC(), Stream: stream, Seq: meta.Sequence.Stream}
			var outcome []Event // what the event keeps besides the move: requests, or the outcome
			_, _, event, _ := topology.ParseTurnLogSubject(m.Subject())
			switch {
			case event == topology.EventTurnOutcome && b.Outcome != nil:
				// The write that ends the batch keeps the turn's outcome.
				outcome, logged[b.TurnID] = outcomeEvents(at, b.Outcome), true
			case event == topology.EventTurnAwaiting:
				// The move to awaiting keeps the approvals it requested.
				for _, a := range b.RequestedApprovals() {
					outcome, logged[a.ApprovalID] = append(outcome, requestedEvent(at, a)), true
				}
			}
			if prev, seen := state[b.TurnID]; q.Approval != "" || seen && prev == b.State {
				moves = append(moves, outcome...)
				return // another write in the same state: a claim, a result
			}
			state[b.TurnID] = b.State
			if b.SessionID != "" && sessions[b.TurnID] == "" {
				sessions[b.TurnID] = b.SessionID
			}
			if b.Context != nil && keys[b.TurnID] == "" {
				keys[b.TurnID] = schemas.SessionKeyOf(b.Context)
			}
			moves = append(append(moves, batchEvent(at, b)), outcome...)
		})
		if err != nil {
			return nil, err
		}
		all = mergeByTime(all, moves)
	}
	return all, nil
}

// batchEvent is the Batch event of b's move to its state, stamped like at.
func batchEvent(at Event, b *schemas.BatchRecord) Event {
	e := at
	e.Kind, e.TurnID, e.SessionID, e.Status, e.Code, e.Reason = Batch, b.TurnID, b.SessionID, string(b.State), string(b.Code), b.Reason
	if b.Context != nil {
		e.Requester = b.Context.Requester.Principal
	}
	switch b.State {
	case schemas.BatchAwaiting:
		for _, id := range b.Approvals {
			if id != "" {
				e.Pending++
			}
		}
	case schemas.BatchCompleted, schemas.BatchFailed:
		for _, r := range b.Results {
			if r != nil {
				e.Results++
			}
		}
	}
	return e
}

// mergeByTime merges a and b, each in its stream's order, by stream time,
// keeping each one's order; on a tie a comes first.
func mergeByTime(a, b []Event) []Event {
	out := make([]Event, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Time.Before(a[0].Time) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// annotate fills in what one event says about another's: the requester
// and session of every event of a turn whose accepted, requested, decided
// or outcome event was read (sessions: turn id -> session, as the read
// found them), the tool of every event of an approval whose requested
// event was read, and on each result, how its approval was decided and by
// whom.
func annotate(events []Event, sessions map[string]string) {
	requesters := map[string]string{}
	tools := map[string]string{} // approval id -> tool
	decided := map[string]Event{}
	for _, e := range events {
		if e.Requester != "" && requesters[e.TurnID] == "" {
			requesters[e.TurnID] = e.Requester
		}
		if e.SessionID != "" && sessions[e.TurnID] == "" {
			sessions[e.TurnID] = e.SessionID
		}
		if e.Kind == Requested {
			tools[e.ApprovalID] = e.Tool
		}
		if _, seen := decided[e.ApprovalID]; e.Kind == Decided && !seen {
			decided[e.ApprovalID] = e // the first is the decision (protocol §1.3)
		}
	}
	for i := range events {
		e := &events[i]
		if e.Requester == "" {
			e.Requester = requesters[e.TurnID]
		}
		if e.SessionID == "" {
			e.SessionID = sessions[e.TurnID]
		}
		if e.Tool == "" {
			e.Tool = tools[e.ApprovalID]
		}
		if d, ok := decided[e.ApprovalID]; e.Kind == Result && ok {
			e.ApprovalStatus = d.Status
			if d.Principal != "" {
				e.DecidedBy = append(e.DecidedBy, d.Principal)
			}
			for _, v := range d.Votes {
				if !slices.Contains(e.DecidedBy, v) {
					e.DecidedBy = append(e.DecidedBy, v)
				}
			}
		}
	}
}

// Matches reports whether e passes q's filters.
func (q Query) Matches(e Event) bool {
	switch {
	case q.Tool != "" && e.Tool != q.Tool:
		return false
	case q.Session != "" && e.SessionID != q.Session:
		return false
	case q.Turn != "" && e.TurnID != q.Turn:
		return false
	case q.Approval != "" && e.ApprovalID != q.Approval:
		return false
	case q.Principal != "":
		return e.Requester == q.Principal || e.Principal == q.Principal ||
			slices.Contains(e.Votes, q.Principal) || slices.Contains(e.DecidedBy, q.Principal)
	}
	return true
}

// readStream calls fn with each message of stream on filters stored within
// [since, until] (a zero bound open), in stream order, through an ordered
// consumer that it deletes afterwards. It stops at the stream's last
// message when it started, so a busy stream cannot keep it reading.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, filters []string, since, until time.Time, fn func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(dctx, stream, info.Name)
		}
	}()
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return nil // nothing stored on filters since since
	}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if meta.Sequence.Stream > last || !until.IsZero() && meta.Timestamp.After(until) {
			return nil
		}
		fn(m, meta)
		if meta.NumPending == 0 || meta.Sequence.Stream == last {
			return nil
		}
	}
}
