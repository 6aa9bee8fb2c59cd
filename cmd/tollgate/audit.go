package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

var auditCmd = &command{
	name:    "audit",
	summary: "the timeline of decisions and executions from the streams: turns, approvals, decisions, rejections, redrives, results",
	example: "tollgate audit --principal cli:alice --since 2h",
	run:     cmdAudit,
}

// Kinds of audit event.
const (
	auditAccepted  = "accepted"  // a turn accepted by ingest (TOLLGATE_TURNS)
	auditRequested = "requested" // an approval requested
	auditDecided   = "decided"   // an approval left pending: approved, denied, expired or abandoned
	auditRejected  = "rejected"  // a decision the approver refused
	auditRedrive   = "redrive"   // a redrive attempt: started, deferred or failed
	auditResult    = "result"    // one call's result, from its turn's outcome
	auditOutcome   = "outcome"   // a turn's outcome
)

// auditEvent is one line of the audit: a stored message, or one call's
// result in a turn outcome (which shares its outcome's time and sequence).
// Kind says which of the optional fields are set.
type auditEvent struct {
	Time   time.Time `json:"time"` // stream time of the message
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	Kind   string    `json:"kind"`

	TurnID     string `json:"turn_id,omitempty"`
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
	// call's result status, or the turn's state (outcome).
	Status     string   `json:"status,omitempty"`
	Option     string   `json:"option,omitempty"`
	Assurance  int      `json:"assurance,omitempty"`
	Votes      []string `json:"votes,omitempty"` // decided: quorum votes, by principal
	DecisionID string   `json:"decision_id,omitempty"`
	Code       string   `json:"code,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Trigger    string   `json:"trigger,omitempty"` // redrive
	Pending    int      `json:"pending,omitempty"` // redrive deferred
	Results    int      `json:"results,omitempty"` // outcome

	// result: how the call's approval was decided, and by whom (the
	// decision's principal and the quorum votes), from its decided event.
	ApprovalStatus string   `json:"approval_status,omitempty"`
	DecidedBy      []string `json:"decided_by,omitempty"`
}

// auditQuery selects the events audit prints. Every filter given must hold.
type auditQuery struct {
	turn, approval, principal string
	since, until              time.Time
}

// cmdAudit prints the timeline of decisions and executions that the
// streams hold, oldest first: accepted turns, approvals requested, decided
// (expiry and abandon included) and refused decisions, redrives, each
// call's result and the turn outcomes.
func cmdAudit(cmd *command, args []string) int { return runAudit(cmd, args, os.Stdout) }

func runAudit(cmd *command, args []string, out io.Writer) int {
	fs := cmd.flags()
	var c client
	c.register(fs, 10*time.Minute) // a day of history can take a while
	var q auditQuery
	fs.StringVar(&q.turn, "turn", "", "only events of this turn")
	fs.StringVar(&q.approval, "approval", "", "only events of this approval: requested, decisions, rejections, its call's result")
	fs.StringVar(&q.principal, "principal", "", "only events where this principal (cli:alice) is the requester, a decider or a refused decider")
	since := fs.String("since", "24h", "only events stored at or after this time: RFC 3339, or a duration ago")
	until := fs.String("until", "", "only events stored at or before this time: RFC 3339, or a duration ago")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	switch {
	case len(pos) > 0:
		return cmd.usageError("no arguments expected, got %q", pos)
	case q.turn != "" && !schemas.ValidKey(q.turn):
		return cmd.usageError("--turn %q is not a turn id", q.turn)
	case q.approval != "" && (!schemas.ValidKey(q.approval) || schemas.TurnIDOfApproval(q.approval) == ""):
		return cmd.usageError("--approval %q is not an approval id", q.approval)
	case q.approval != "" && q.turn != "" && schemas.TurnIDOfApproval(q.approval) != q.turn:
		return cmd.usageError("approval %s is not of turn %s", q.approval, q.turn)
	}
	var err error
	if q.since, err = parseWhen(*since); err != nil {
		return fail("audit: --since: %v", err)
	}
	if q.until, err = parseWhen(*until); err != nil {
		return fail("audit: --until: %v", err)
	}
	if !q.until.IsZero() && q.until.Before(q.since) {
		return fail("audit: --until %s is before --since %s", q.until.Format(time.RFC3339), q.since.Format(time.RFC3339))
	}
	if err := c.connect(); err != nil {
		return c.fail("audit", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	events, err := readAudit(ctx, c.js, q)
	if err != nil {
		return c.fail("audit", err)
	}
	if c.json {
		enc := json.NewEncoder(out)
		enc.SetEscapeHTML(false)
		for _, e := range events {
			_ = enc.Encode(e)
		}
		return 0
	}
	printAudit(out, events)
	return 0
}

// readAudit reads the events q selects from TOLLGATE_EVENTS and (unless q
// is about one approval) the accepted turns from TOLLGATE_TURNS, stored
// within [q.since, q.until], up to each stream's last message when it
// started. It returns them oldest first: each stream in its order, the two
// merged by stream time. Messages it cannot decode are reported on stderr
// and left out.
func readAudit(ctx context.Context, js jetstream.JetStream, q auditQuery) ([]auditEvent, error) {
	var events, turns []auditEvent
	sessions := map[string]string{} // turn id -> session id
	err := readStream(ctx, js, topology.StreamEvents, auditFilters(q), q.since, q.until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
		at := auditEvent{Time: meta.Timestamp.UTC(), Stream: topology.StreamEvents, Seq: meta.Sequence.Stream}
		es, session, err := decodeAuditEvent(at, m.Subject(), m.Data())
		if err != nil {
			fmt.Fprintf(os.Stderr, "tollgate audit: skipped %s seq %d: %v\n", m.Subject(), meta.Sequence.Stream, err)
			return
		}
		if session != "" && len(es) > 0 {
			sessions[es[0].TurnID] = session
		}
		events = append(events, es...)
	})
	if err != nil {
		return nil, err
	}
	if q.approval == "" {
		// The turns stream is keyed by session, not turn: a turn's own
		// session narrows the read when one of its events named it.
		filter := topology.SubjectTurnAccepted + "*"
		if s := sessions[q.turn]; q.turn != "" && s != "" {
			filter = topology.AcceptedSubject(schemas.SessionKey(s))
		}
		err = readStream(ctx, js, topology.StreamTurns, []string{filter}, q.since, q.until, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
			t, err := schemas.Decode[schemas.AcceptedTurn](m.Data())
			if err != nil {
				fmt.Fprintf(os.Stderr, "tollgate audit: skipped %s seq %d: %v\n", m.Subject(), meta.Sequence.Stream, err)
				return
			}
			if q.turn != "" && t.TurnID != q.turn {
				return
			}
			e := auditEvent{Time: meta.Timestamp.UTC(), Stream: topology.StreamTurns, Seq: meta.Sequence.Stream,
				Kind: auditAccepted, TurnID: t.TurnID, Calls: len(t.Calls), Origin: t.Origin}
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
	all := mergeByTime(turns, events)
	annotate(all)
	return slices.DeleteFunc(all, func(e auditEvent) bool { return !q.matches(e) }), nil
}

// auditFilters are the TOLLGATE_EVENTS subjects q needs: the ids are in
// the subjects, so a turn's or an approval's events are read alone.
// Awaiting notices are control messages and not read.
func auditFilters(q auditQuery) []string {
	turn := q.turn
	if q.approval != "" {
		turn = schemas.TurnIDOfApproval(q.approval)
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
	if q.approval != "" {
		return append(f, topology.EventSubject(topology.SubjectDecisionRejected, q.approval))
	}
	f = append(f, topology.SubjectRedrive+"*."+turn)
	for i := 0; i < schemas.MaxCalls; i++ { // rejections are keyed by approval id
		f = append(f, topology.EventSubject(topology.SubjectDecisionRejected, schemas.ApprovalID(turn, i)))
	}
	return f
}

// decodeAuditEvent turns the event stored on subject into audit events
// stamped like at (a turn outcome becomes one per result, then itself) and
// returns the session the event names, if any.
func decodeAuditEvent(at auditEvent, subject string, data []byte) ([]auditEvent, string, error) {
	switch {
	case strings.HasPrefix(subject, topology.SubjectApprovalRequested):
		a, err := schemas.Decode[schemas.ApprovalRecord](data)
		if err != nil {
			return nil, "", err
		}
		e := at
		e.Kind, e.TurnID, e.ApprovalID, e.CallID = auditRequested, a.TurnID, a.ApprovalID, a.CallID
		e.Tool, e.ArgsDigest, e.Options, e.Quorum = a.Tool, a.ArgsDigest, a.Options, a.Quorum
		if !a.ExpiresAt.IsZero() {
			t := a.ExpiresAt.UTC()
			e.ExpiresAt = &t
		}
		if a.Context != nil {
			e.Requester = a.Context.Requester.Principal
		}
		return []auditEvent{e}, a.SessionID, nil
	case strings.HasPrefix(subject, topology.SubjectApprovalDecided):
		d, err := schemas.Decode[schemas.DecidedEvent](data)
		if err != nil {
			return nil, "", err
		}
		e := at
		e.Kind, e.TurnID, e.ApprovalID, e.Status = auditDecided, d.TurnID, d.ApprovalID, string(d.Status)
		if d.Decision != nil {
			e.Principal, e.Option, e.Assurance, e.DecisionID = d.Decision.Principal, d.Decision.Option, int(d.Decision.Assurance), d.Decision.DecisionID
		}
		for _, v := range d.Votes {
			e.Votes = append(e.Votes, v.Principal)
		}
		return []auditEvent{e}, d.SessionID, nil
	case strings.HasPrefix(subject, topology.SubjectDecisionRejected):
		r, err := schemas.Decode[schemas.DecisionRejected](data)
		if err != nil {
			return nil, "", err
		}
		e := at
		e.Kind, e.TurnID, e.ApprovalID, e.Principal = auditRejected, schemas.TurnIDOfApproval(r.ApprovalID), r.ApprovalID, r.Principal
		e.DecisionID, e.Code, e.Reason = r.DecisionID, string(r.Code), r.Reason
		return []auditEvent{e}, "", nil
	case strings.HasPrefix(subject, topology.SubjectRedrive):
		o, err := schemas.Decode[schemas.RedriveOutcome](data)
		if err != nil {
			return nil, "", err
		}
		e := at
		e.Kind, e.TurnID, e.Status, e.Code, e.Reason = auditRedrive, o.TurnID, string(o.Kind), string(o.Code), o.Reason
		e.Trigger, e.Pending = o.Trigger, o.Pending
		return []auditEvent{e}, "", nil
	case strings.HasPrefix(subject, topology.SubjectTurnOutcome):
		o, err := schemas.Decode[schemas.TurnOutcome](data)
		if err != nil {
			return nil, "", err
		}
		var out []auditEvent
		for _, r := range o.Results {
			e := at
			e.Kind, e.TurnID, e.CallID, e.ApprovalID, e.Tool = auditResult, o.TurnID, r.CallID, r.ApprovalID, r.Tool
			e.Status, e.Code, e.Reason = string(r.Status), string(r.Code), r.Reason
			out = append(out, e)
		}
		e := at
		e.Kind, e.TurnID, e.Status, e.Code, e.Reason, e.Results = auditOutcome, o.TurnID, string(o.State), string(o.Code), o.Reason, len(o.Results)
		return append(out, e), o.SessionID, nil
	}
	return nil, "", fmt.Errorf("not an audited subject")
}

// mergeByTime merges a and b, each in its stream's order, by stream time,
// keeping each one's order; on a tie a comes first.
func mergeByTime(a, b []auditEvent) []auditEvent {
	out := make([]auditEvent, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Time.Before(a[0].Time) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// annotate fills in what one event says about another's: the requester of
// every event of a turn whose accepted or requested event was read, and
// on each result, how its approval was decided and by whom.
func annotate(events []auditEvent) {
	requesters := map[string]string{}
	decided := map[string]auditEvent{}
	for _, e := range events {
		if e.Requester != "" && requesters[e.TurnID] == "" {
			requesters[e.TurnID] = e.Requester
		}
		if _, seen := decided[e.ApprovalID]; e.Kind == auditDecided && !seen {
			decided[e.ApprovalID] = e // the first is the decision (protocol §1.3)
		}
	}
	for i := range events {
		e := &events[i]
		if e.Requester == "" {
			e.Requester = requesters[e.TurnID]
		}
		if d, ok := decided[e.ApprovalID]; e.Kind == auditResult && ok {
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

// matches reports whether e passes q's turn, approval and principal filters.
func (q auditQuery) matches(e auditEvent) bool {
	switch {
	case q.turn != "" && e.TurnID != q.turn:
		return false
	case q.approval != "" && e.ApprovalID != q.approval:
		return false
	case q.principal != "":
		return e.Requester == q.principal || e.Principal == q.principal ||
			slices.Contains(e.Votes, q.principal) || slices.Contains(e.DecidedBy, q.principal)
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

// printAudit writes events as a table, one line each.
func printAudit(w io.Writer, events []auditEvent) {
	if len(events) == 0 {
		fmt.Fprintln(w, "no events (widen --since, or check the filters)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tEVENT\tTURN\tAPPROVAL / CALL\tWHO\tDETAIL")
	for _, e := range events {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Format("2006-01-02T15:04:05.000Z07:00"), e.Kind,
			orDash(e.TurnID), auditSubject(e), auditWho(e), auditDetail(e))
	}
	_ = tw.Flush()
}

// auditSubject is the approval an event is about, or for a result its call.
func auditSubject(e auditEvent) string {
	if e.Kind == auditResult {
		return e.CallID
	}
	return orDash(e.ApprovalID)
}

// auditWho is the principal an event is about: who acted, else whose turn.
func auditWho(e auditEvent) string {
	switch {
	case e.Kind == auditResult && len(e.DecidedBy) > 0:
		return strings.Join(e.DecidedBy, ",")
	case e.Principal != "":
		return e.Principal
	}
	return orDash(e.Requester)
}

// auditDetail is the rest of an event in a few words.
func auditDetail(e auditEvent) string {
	var b strings.Builder
	coded := func() {
		if e.Code != "" {
			fmt.Fprintf(&b, " %s", e.Code)
		}
		if e.Reason != "" {
			fmt.Fprintf(&b, ": %s", clip(strings.ReplaceAll(e.Reason, "\n", " "), 80))
		}
	}
	switch e.Kind {
	case auditAccepted:
		fmt.Fprintf(&b, "%s %s, audience %s, %d calls", e.Transport, e.Channel, e.Audience, e.Calls)
		if e.Origin != "" {
			fmt.Fprintf(&b, ", follow-up of %s", e.Origin)
		}
	case auditRequested:
		expires := "never"
		if e.ExpiresAt != nil {
			expires = e.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "%s %s, options %s, expires %s", e.Tool, e.ArgsDigest, strings.Join(e.Options, "|"), expires)
		if e.Quorum > 1 {
			fmt.Fprintf(&b, ", quorum %d", e.Quorum)
		}
	case auditDecided:
		b.WriteString(e.Status)
		if e.Option != "" {
			fmt.Fprintf(&b, " (%s, assurance %d)", e.Option, e.Assurance)
		}
		if len(e.Votes) > 0 {
			fmt.Fprintf(&b, ", votes %s", strings.Join(e.Votes, ","))
		}
	case auditRejected:
		b.WriteString("refused")
		coded()
	case auditRedrive:
		b.WriteString(e.Status)
		coded()
		fmt.Fprintf(&b, " (%s)", cmp.Or(e.Trigger, "no trigger"))
	case auditResult:
		fmt.Fprintf(&b, "%s %s", e.Tool, e.Status)
		coded()
		if e.ApprovalStatus != "" {
			fmt.Fprintf(&b, ", approval %s", e.ApprovalStatus)
		}
	case auditOutcome:
		b.WriteString(e.Status)
		coded()
		fmt.Fprintf(&b, ", %d results", e.Results)
	}
	return b.String()
}
