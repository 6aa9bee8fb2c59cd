package schemas

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Current schema versions. A decoder accepts exactly these; see Decode.
const (
	InboundVersion          = 1
	TurnContextVersion      = 1
	AcceptedTurnVersion     = 1
	DecisionVersion         = 1
	ApprovalVersion         = 2 // version 1 is reserved for the legacy shape without a persisted TurnContext
	DecidedEventVersion     = 1
	DecisionRejectedVersion = 1
	RedriveOutcomeVersion   = 1
	TurnOutcomeVersion      = 1
	BatchVersion            = 2 // version 1 kept its claims in tollgate_claims (BatchRecordV1)
	SessionVersion          = 1
	ClaimVersion            = 1
	NoticeVersion           = 1
)

// ChannelKind is where a message was posted.
type ChannelKind string

const (
	ChannelDM      ChannelKind = "dm"
	ChannelPrivate ChannelKind = "private"
	ChannelPublic  ChannelKind = "public"
)

// Audience is who may see a turn's results. It is derived once, at ingest,
// from the channel kind; there is no default audience.
type Audience string

const (
	AudiencePersonal Audience = "personal"
	AudienceTeam     Audience = "team"
	AudiencePublic   Audience = "public"
)

// AudienceOf maps a channel kind to the audience of what is posted there:
// dm is personal, private is team, public is public.
func AudienceOf(k ChannelKind) (Audience, error) {
	switch k {
	case ChannelDM:
		return AudiencePersonal, nil
	case ChannelPrivate:
		return AudienceTeam, nil
	case ChannelPublic:
		return AudiencePublic, nil
	}
	return "", Errorf(CodeInvalidInput, "channel kind %q has no audience", k)
}

// Wider reports whether a reaches more people than b (public > team >
// personal). Unknown audiences are widest: they never pass a containment
// check.
func (a Audience) Wider(b Audience) bool { return a.rank() > b.rank() }

// Admits reports whether what a turn of audience a says may be shown in a
// channel of kind k: a is a known audience and k reaches no more people
// than a (dm for personal; dm or private for team; any for public). It is
// the containment rule of decisions (a decider must not answer where more
// people see the call) and of deliveries (an outcome or reply goes nowhere
// wider than its turn's audience, and nowhere at all with audience "").
func (a Audience) Admits(k ChannelKind) bool {
	where, err := AudienceOf(k)
	return a.valid() && err == nil && !where.Wider(a)
}

func (a Audience) rank() int {
	switch a {
	case AudiencePersonal:
		return 0
	case AudienceTeam:
		return 1
	case AudiencePublic:
		return 2
	}
	return 3
}

// SenderKind distinguishes people from automation. Only a user can answer an
// approval prompt interactively.
type SenderKind string

const (
	SenderUser    SenderKind = "user"
	SenderBot     SenderKind = "bot"
	SenderService SenderKind = "service"
)

// Sender is the transport identity of whoever sent a message or decision.
type Sender struct {
	ID       string     `msgpack:"id"`
	Display  string     `msgpack:"display,omitempty"`
	Kind     SenderKind `msgpack:"kind"`
	Verified bool       `msgpack:"verified"`
	// Strong: the transport verified this identity with a second factor
	// (SSO with MFA, a hardware key). Meaningful only with Verified.
	Strong bool `msgpack:"strong,omitempty"`
}

// Assurance is how strongly a transport vouched for a sender's identity.
type Assurance int

const (
	AssuranceNone     Assurance = iota // not verified: anyone could claim the id
	AssuranceVerified                  // the transport authenticated the sender
	AssuranceStrong                    // authenticated with a second factor
)

// Assurance returns the level the transport vouched for.
func (s Sender) Assurance() Assurance {
	switch {
	case !s.Verified:
		return AssuranceNone
	case s.Strong:
		return AssuranceStrong
	default:
		return AssuranceVerified
	}
}

// Channel is a transport location: a channel or DM and optionally a thread.
type Channel struct {
	ID     string      `msgpack:"id"`
	Kind   ChannelKind `msgpack:"kind"`
	Thread string      `msgpack:"thread,omitempty"`
}

// ProposedCall is a tool call proposed by the agent, as the transport sends
// it: the tool name and its arguments as a JSON object.
type ProposedCall struct {
	Tool string `msgpack:"tool"`
	Args string `msgpack:"args"`
}

// InboundMessage is what a chat transport publishes on tollgate.inbound.<transport>.<session key> (topology.InboundSubject).
// (Transport, MessageID) identifies it; a redelivered or re-sent message with
// the same pair is the same turn.
type InboundMessage struct {
	V         Version        `msgpack:"v"`
	Transport string         `msgpack:"transport"`
	MessageID string         `msgpack:"message_id"`
	SessionID string         `msgpack:"session_id"`
	Sender    Sender         `msgpack:"sender"`
	Channel   Channel        `msgpack:"channel"`
	Text      string         `msgpack:"text"`
	Calls     []ProposedCall `msgpack:"calls"`
	SentAt    time.Time      `msgpack:"sent_at"`
}

// Requester is the person (or automation) whose turn this is.
type Requester struct {
	Principal string     `msgpack:"principal"`
	SenderID  string     `msgpack:"sender_id"`
	Display   string     `msgpack:"display,omitempty"`
	Kind      SenderKind `msgpack:"kind"`
	Verified  bool       `msgpack:"verified"`
}

// Provenance records where a TurnContext came from.
type Provenance struct {
	Transport  string    `msgpack:"transport"`
	MessageID  string    `msgpack:"message_id"`
	StreamSeq  uint64    `msgpack:"stream_seq"`
	ReceivedAt time.Time `msgpack:"received_at"`
	IngestedBy string    `msgpack:"ingested_by"`
}

// TurnContext is the one authority a turn's tool calls run under. Ingest
// builds it once from the inbound message and the channel policy; every later
// stage reads it only from what was persisted with the turn, batch or
// approval record.
type TurnContext struct {
	V         Version `msgpack:"v"`
	SessionID string  `msgpack:"session_id"`
	// SessionKey is SessionKey(Transport, SessionID), computed once at
	// ingest: the session the turn belongs to (its record, order queue and
	// planner conversation). Empty in contexts sealed by the previous
	// version, whose turns keep their legacy session (SessionKeyOf).
	SessionKey    string     `msgpack:"session_key,omitempty"`
	TurnID        string     `msgpack:"turn_id"`
	Requester     Requester  `msgpack:"requester"`
	Transport     string     `msgpack:"transport"`
	Channel       Channel    `msgpack:"channel"`
	Audience      Audience   `msgpack:"audience"`
	TrustBoundary string     `msgpack:"trust_boundary"`
	Interactive   bool       `msgpack:"interactive"`
	Provenance    Provenance `msgpack:"provenance"`
	CreatedAt     time.Time  `msgpack:"created_at"`
	// LegacyRestored marks a context rebuilt by the one compatibility path
	// (pipeline/legacy) from a version 1 approval record's copied fields,
	// rather than captured at ingest. It is covered by the seal.
	LegacyRestored bool `msgpack:"legacy_restored,omitempty"`
	// Seal authenticates every other field (see package seal). A context
	// without a valid seal is never used as authority.
	Seal *Seal `msgpack:"seal,omitempty"`
}

// Seal is an HMAC-SHA256 over a TurnContext's canonical encoding (the
// context with Seal unset; see SealedBytes), made with the key named KeyID.
type Seal struct {
	KeyID string `msgpack:"kid"`
	MAC   []byte `msgpack:"mac"`
}

// ToolCall is one call of a batch, with its arguments in canonical JSON and
// their digest (see CanonicalArgs).
type ToolCall struct {
	CallID     string `msgpack:"call_id"`
	Index      int    `msgpack:"index"`
	Tool       string `msgpack:"tool"`
	Args       string `msgpack:"args"`
	ArgsDigest string `msgpack:"args_digest"`
}

// AcceptedTurn is what ingest appends to its session's order
// (tollgate.turn.order.<kind>.<session key>; step batches and follow-ups
// travel on tollgate.turn.accepted.<session key>).
type AcceptedTurn struct {
	V          Version      `msgpack:"v"`
	TurnID     string       `msgpack:"turn_id"`
	Context    *TurnContext `msgpack:"context"`
	Text       string       `msgpack:"text"`
	Calls      []ToolCall   `msgpack:"calls"`
	AcceptedAt time.Time    `msgpack:"accepted_at"`
	// Origin is set on follow-up work: the call id of the tool call that
	// scheduled it. Its Context is then that turn's context, unchanged
	// (inherited authority), and TurnID is FollowUpTurnID(Origin).
	Origin string `msgpack:"origin,omitempty"`
	// NotBefore is set on follow-up work: when it is due. The executor
	// never starts the turn before it.
	NotBefore time.Time `msgpack:"not_before,omitempty"`
	// FollowUpDepth is how many follow-ups deep the turn is: 0 for a turn
	// accepted from an inbound message, the scheduling turn's depth plus
	// one for follow-up work (at most MaxFollowUpDepth). Omitted while 0;
	// a record written before the field existed reads as 0.
	FollowUpDepth int `msgpack:"followup_depth,omitempty"`
}

// Decision options a prompt can offer.
const (
	OptionApprove = "approve"
	OptionDeny    = "deny"
	// OptionRevoke, on a Decision whose approval_id is a grant id (g-...),
	// asks the approver to revoke that standing grant (docs/protocol.md
	// §15): the way a transport whose NATS user may not write the grants
	// bucket revokes one.
	OptionRevoke = "revoke"
)

// Decision is a human's answer to an approval prompt, published on
// tollgate.decision.submit. The decider's identity is that of the transport
// that delivered it; authority to decide is checked against the approval's
// persisted TurnContext and policy, never taken from the decision.
type Decision struct {
	V          Version   `msgpack:"v"`
	DecisionID string    `msgpack:"decision_id"`
	ApprovalID string    `msgpack:"approval_id"`
	Transport  string    `msgpack:"transport"`
	Decider    Sender    `msgpack:"decider"`
	Channel    *Channel  `msgpack:"channel,omitempty"`
	Option     string    `msgpack:"option"`
	ArgsDigest string    `msgpack:"args_digest,omitempty"`
	Note       string    `msgpack:"note,omitempty"`
	SentAt     time.Time `msgpack:"sent_at"`
}

// ApprovalStatus is the state of an approval record. Legal transitions:
// pending -> approved | denied | expired | abandoned; nothing leaves a
// decided state.
type ApprovalStatus string

const (
	ApprovalPending   ApprovalStatus = "pending"
	ApprovalApproved  ApprovalStatus = "approved"
	ApprovalDenied    ApprovalStatus = "denied"
	ApprovalExpired   ApprovalStatus = "expired"
	ApprovalAbandoned ApprovalStatus = "abandoned"
)

// Decided reports whether s is a final state.
func (s ApprovalStatus) Decided() bool {
	switch s {
	case ApprovalApproved, ApprovalDenied, ApprovalExpired, ApprovalAbandoned:
		return true
	}
	return false
}

// DecisionInfo records who moved an approval out of pending, and how.
type DecisionInfo struct {
	DecisionID string    `msgpack:"decision_id"`
	Principal  string    `msgpack:"principal"`
	Option     string    `msgpack:"option"`
	DecidedAt  time.Time `msgpack:"decided_at"`
	// Assurance the transport vouched for the decider with, kept so the
	// redriver can re-check the grant against the current policy.
	Assurance Assurance `msgpack:"assurance,omitempty"`
	// Grant is set when a standing grant, not a person, made this
	// decision (Principal is then the grant's principal, Option its
	// option, DecisionID its grant id). Omitted otherwise.
	Grant *GrantUse `msgpack:"grant,omitempty"`
	// Note is the decider's note sent with the decision (a deny reason,
	// an approve comment), kept as sent: Decision.Note is already capped
	// at MaxNoteBytes when the decision is validated. It is data to
	// show, never an instruction, and it decides nothing. Omitted when
	// the decision carried none.
	Note string `msgpack:"note,omitempty"`
}

// ApprovalRecord is the pending (or decided) approval of one tool call, kept
// in KV bucket tollgate_approvals under its ApprovalID. It carries the turn's
// TurnContext and the exact call it approves. The same encoding is the
// payload of tollgate.event.approval.requested.
type ApprovalRecord struct {
	V             Version        `msgpack:"v"`
	ApprovalID    string         `msgpack:"approval_id"`
	TurnID        string         `msgpack:"turn_id"`
	SessionID     string         `msgpack:"session_id"`
	CallID        string         `msgpack:"call_id"`
	Context       *TurnContext   `msgpack:"context"`
	Tool          string         `msgpack:"tool"`
	Args          string         `msgpack:"args"`
	ArgsDigest    string         `msgpack:"args_digest"`
	PolicyVersion string         `msgpack:"policy_version"`
	Options       []string       `msgpack:"options"`
	Status        ApprovalStatus `msgpack:"status"`
	RequestedAt   time.Time      `msgpack:"requested_at"`
	ExpiresAt     time.Time      `msgpack:"expires_at"` // zero: never expires
	Decision      *DecisionInfo  `msgpack:"decision,omitempty"`
	// Quorum is how many distinct authorized deciders must approve (policy
	// at request time; 0 and 1 both mean one). A single deny decides.
	Quorum int `msgpack:"quorum,omitempty"`
	// Votes are the approvals counted towards Quorum while pending.
	Votes []DecisionInfo `msgpack:"votes,omitempty"`
	// Trace is the W3C trace context (traceparent, tracestate) of the span
	// that requested the approval, which the redrive after the decision
	// links to (package tracing); absent when tracing was off.
	Trace map[string]string `msgpack:"trace,omitempty"`
	// Grants describes each grant option among Options: what choosing it
	// would cover and for how long (see GrantOffer). Omitted when none is
	// offered.
	Grants []GrantOffer `msgpack:"grants,omitempty"`
	// Preview is what the call would change as the executor found it when
	// it created the record (tools.PreviewCall): advisory only. It is not
	// covered by ArgsDigest, nor by anything a decision is checked against:
	// the decision binds the arguments, never the preview. Absent on
	// records written before previews existed and on records whose tool
	// was not asked (decided by a standing grant).
	Preview *ApprovalPreview `msgpack:"preview,omitempty"`
}

// ApprovalPreview is an ApprovalRecord's preview of the call's effect, as
// of At. Status is "ok" (Kind and Text say what the call would change),
// "unsupported" (the tool offers none), "failed" or "timed_out" (Reason
// says why there is none). Text is untrusted, like the arguments: every
// surface shows it escaped (package reveal). Text is at most
// MaxPreviewBytes, Reason at most MaxPreviewReasonBytes.
//
// What a preview reveals of existing content (Text, Reason) is for the
// people who may decide the approval only (docs/security.md rule 17): the
// record in tollgate_approvals keeps it whole, and every other surface
// shows SummaryOnly, which has the counts instead (Redacted set).
type ApprovalPreview struct {
	Status    string    `msgpack:"status"`
	Kind      string    `msgpack:"kind,omitempty"`
	Text      string    `msgpack:"text,omitempty"`
	Reason    string    `msgpack:"reason,omitempty"`
	Truncated bool      `msgpack:"truncated,omitempty"`
	At        time.Time `msgpack:"at"`
	// Redacted marks the summary-only form (SummaryOnly): Text and Reason
	// are left out, and Added, Removed and Lines say what Summary needs.
	// Never set on a stored record.
	Redacted bool `msgpack:"redacted,omitempty"`
	// Added and Removed are a diff's added and removed lines, Lines a new
	// file's or a text's lines: set in the summary-only form only (a whole
	// preview's are counted from Text: Counts).
	Added   int `msgpack:"added,omitempty"`
	Removed int `msgpack:"removed,omitempty"`
	Lines   int `msgpack:"lines,omitempty"`
}

// Preview statuses of ApprovalPreview (the values of tools.PreviewResult).
const (
	PreviewOK          = "ok"
	PreviewUnsupported = "unsupported"
	PreviewFailed      = "failed"
	PreviewTimedOut    = "timed_out"
)

// Preview caps: a preview's text and its reason.
const (
	MaxPreviewBytes       = 16 << 10
	MaxPreviewReasonBytes = 512
)

// Offer returns the grant offer of option, if the prompt made one.
func (a *ApprovalRecord) Offer(option string) (GrantOffer, bool) {
	for _, g := range a.Grants {
		if g.Option == option {
			return g, true
		}
	}
	return GrantOffer{}, false
}

// Decided returns a copy of a, a record as it was requested (or as last
// read), with the outcome that decided event ev announces applied: its
// status, decision and, when the event carries them, its votes. A decided
// record changes no more, so this is the record as stored after the
// decision (pipeline/replay rebuilds records this way; the gateway serves
// them without reading them again). ev must be a's.
func (a *ApprovalRecord) Decided(ev *DecidedEvent) *ApprovalRecord {
	out := *a
	out.Status, out.Decision = ev.Status, ev.Decision
	if ev.Votes != nil {
		out.Votes = ev.Votes
	}
	return &out
}

// DecidedOf is the decided event that approval record a's decision
// announces, a projection of the record (its inverse is Decided): nil
// while a is pending. At is the decision's time. The approvals bucket's
// revision that holds a decided record is that decision's event
// (pipeline/store, DecidedOf); the approver publishes one only as its
// answer to a repeated decision, with Repeat set.
func DecidedOf(a *ApprovalRecord) *DecidedEvent {
	if a == nil || !a.Status.Decided() {
		return nil
	}
	ev := &DecidedEvent{
		ApprovalID: a.ApprovalID, TurnID: a.TurnID, SessionID: a.SessionID,
		Status: a.Status, Decision: a.Decision, Votes: a.Votes,
	}
	if a.Decision != nil {
		ev.At = a.Decision.DecidedAt
	}
	return ev
}

// AsRequested returns what a batch's awaiting write keeps of approval
// record a (BatchRecord.Requested): a copy as the approval-requested
// event announces it (SummaryOnly), without its context and arguments,
// which are its batch's.
func (a *ApprovalRecord) AsRequested() *ApprovalRecord {
	out := *a.SummaryOnly()
	out.Context, out.Args = nil, ""
	return &out
}

// RequestedApprovals returns the approvals b's awaiting write requested
// (BatchRecord.Requested), each whole again: the record the
// approval-requested event announced, its context and arguments the
// batch's (the same values, so the same bytes once encoded). Nil when b
// carries none. b must have passed validation (DecodeBatch), which
// checks that each binds one of b's calls.
func (b *BatchRecord) RequestedApprovals() []*ApprovalRecord {
	if len(b.Requested) == 0 {
		return nil
	}
	out := make([]*ApprovalRecord, 0, len(b.Requested))
	for _, a := range b.Requested {
		i := slices.IndexFunc(b.Calls, func(c ToolCall) bool { return c.CallID == a.CallID })
		if i < 0 {
			continue
		}
		r := *a
		r.Context, r.Args = b.Context, b.Calls[i].Args
		out = append(out, &r)
	}
	return out
}

// Offers reports whether option is one of the options the prompt offered.
func (a *ApprovalRecord) Offers(option string) bool {
	for _, o := range a.Options {
		if o == option {
			return true
		}
	}
	return false
}

// DecidedEvent is published on tollgate.event.approval.decided when an
// approval leaves pending.
type DecidedEvent struct {
	V          Version        `msgpack:"v"`
	ApprovalID string         `msgpack:"approval_id"`
	TurnID     string         `msgpack:"turn_id"`
	SessionID  string         `msgpack:"session_id"`
	Status     ApprovalStatus `msgpack:"status"`
	Decision   *DecisionInfo  `msgpack:"decision,omitempty"`
	At         time.Time      `msgpack:"at"`
	// Votes are the record's quorum votes as it left pending (see
	// ApprovalRecord.Votes), so that the decided record can be rebuilt
	// from the requested and decided events alone (pipeline/replay).
	Votes []DecisionInfo `msgpack:"votes,omitempty"`
	// Repeat, on an announcement made again for a decision that repeated
	// the recorded outcome (an idempotent success: protocol §9.2), is that
	// decision's id: the announcement is its answer (Answers), while
	// Decision stays the decision recorded first. Empty otherwise.
	Repeat string `msgpack:"repeat,omitempty"`
}

// DecisionRejected is published on tollgate.event.decision.rejected so the
// transport that sent a decision can tell its sender why it did not apply.
type DecisionRejected struct {
	V          Version   `msgpack:"v"`
	DecisionID string    `msgpack:"decision_id"`
	ApprovalID string    `msgpack:"approval_id"`
	Principal  string    `msgpack:"principal"`
	Code       Code      `msgpack:"code"`
	Reason     string    `msgpack:"reason"`
	At         time.Time `msgpack:"at"`
}

// RedriveKind is the outcome of one redrive attempt.
type RedriveKind string

const (
	RedriveStarted  RedriveKind = "started"
	RedriveDeferred RedriveKind = "deferred"
	RedriveFailed   RedriveKind = "failed"
)

// RedriveOutcome is published on tollgate.event.redrive.<kind> for every
// redrive attempt.
type RedriveOutcome struct {
	V       Version     `msgpack:"v"`
	TurnID  string      `msgpack:"turn_id"`
	Kind    RedriveKind `msgpack:"kind"`
	Code    Code        `msgpack:"code,omitempty"`
	Reason  string      `msgpack:"reason,omitempty"`
	Pending int         `msgpack:"pending"`
	Trigger string      `msgpack:"trigger"`
	At      time.Time   `msgpack:"at"`
}

// ResultStatus is the outcome of one tool call.
type ResultStatus string

const (
	ResultOK             ResultStatus = "ok"
	ResultError          ResultStatus = "error"     // the tool ran and failed
	ResultDenied         ResultStatus = "denied"    // policy or a decider said no; the tool did not run
	ResultFailed         ResultStatus = "failed"    // fail-closed: authority or input problem; the tool did not run
	ResultExpired        ResultStatus = "expired"   // the approval expired; the tool did not run
	ResultAbandoned      ResultStatus = "abandoned" // the approval was abandoned; the tool did not run
	ResultNeedsAttention ResultStatus = "needs_attention"
)

// ToolResult is the result of one call.
type ToolResult struct {
	CallID     string       `msgpack:"call_id"`
	Tool       string       `msgpack:"tool"`
	Status     ResultStatus `msgpack:"status"`
	Output     string       `msgpack:"output,omitempty"`
	Code       Code         `msgpack:"code,omitempty"`
	Reason     string       `msgpack:"reason,omitempty"`
	ApprovalID string       `msgpack:"approval_id,omitempty"`
	FinishedAt time.Time    `msgpack:"finished_at"`
}

// BatchState is the state of a turn's batch.
type BatchState string

const (
	BatchQueued    BatchState = "queued"    // waiting for its session's previous batch
	BatchRunning   BatchState = "running"   // the executor is evaluating and running calls
	BatchAwaiting  BatchState = "awaiting"  // waiting for approvals
	BatchStarted   BatchState = "started"   // redriven: every approval decided, calls running
	BatchCompleted BatchState = "completed" // terminal: every call has a result
	BatchFailed    BatchState = "failed"    // terminal: authority could not be restored
)

// Terminal reports whether s is a final state.
func (s BatchState) Terminal() bool { return s == BatchCompleted || s == BatchFailed }

// BatchRecord is a turn's batch, kept in KV bucket tollgate_batches under its
// turn id. Approvals and Results are indexed by call index.
type BatchRecord struct {
	V         Version       `msgpack:"v"`
	TurnID    string        `msgpack:"turn_id"`
	SessionID string        `msgpack:"session_id"`
	Context   *TurnContext  `msgpack:"context"`
	Text      string        `msgpack:"text,omitempty"`
	Calls     []ToolCall    `msgpack:"calls"`
	State     BatchState    `msgpack:"state"`
	Approvals []string      `msgpack:"approvals"`
	Results   []*ToolResult `msgpack:"results"`
	Code      Code          `msgpack:"code,omitempty"`
	Reason    string        `msgpack:"reason,omitempty"`
	CreatedAt time.Time     `msgpack:"created_at"`
	UpdatedAt time.Time     `msgpack:"updated_at"`
	// Origin: see AcceptedTurn.Origin.
	Origin string `msgpack:"origin,omitempty"`
	// FollowUpDepth: the accepted turn's (see AcceptedTurn.FollowUpDepth).
	FollowUpDepth int `msgpack:"followup_depth,omitempty"`
	// Plan marks the batch record of a planner turn (an agent loop): it has
	// no calls of its own (they run in its step batches), the planner alone
	// moves it (queued when the turn is recorded, running while the loop
	// holds its session, terminal when the loop ends), and no executor ever
	// runs it. See pipeline/planner.
	Plan bool `msgpack:"plan,omitempty"`
	// HeldBy is the planner turn whose hold on the session this batch (one
	// of its steps) ran under, instead of taking the session queue itself;
	// empty for a batch that took its session.
	HeldBy string `msgpack:"held_by,omitempty"`
	// SupersededBy, on a planner turn's batch record, is the newer turn of
	// the session that superseded the loop (session policy "supersede"):
	// the loop takes no further model step and fails TURN_SUPERSEDED.
	SupersededBy string `msgpack:"superseded_by,omitempty"`
	// Claims (version 2) are the calls' execution claims, by call index:
	// a call is claimed, by the write of this record that sets its entry,
	// before its tool starts, and its result is written into Results by a
	// later write. A claim without a result is a call that may have run
	// (see pipeline/batch, "Execution claims"). Empty, or one entry per
	// call; nil entries are unclaimed calls.
	Claims []*CallClaim `msgpack:"claims,omitempty"`
	// Outcome, on a terminal record only (version 2), is the turn's
	// outcome as pipeline/batch's Outcome builds it from this record when
	// the batch ends: what the outcome's readers are told (its reply
	// target, audience and results come from a TurnContext the key ring
	// accepts). It is written once, by the write that ends the batch (the
	// turn log's outcome event), so that readers need no keys and the
	// outcome is durable in one place. Nil on every other record, and on a
	// terminal record an earlier version wrote.
	Outcome *TurnOutcome `msgpack:"outcome,omitempty"`
	// Requested, on the write that moves a version 2 batch to awaiting
	// only (its turn log's awaiting event), are the approvals that write
	// makes the batch wait on, as they were requested: each the record
	// the approval-requested event announces (summary-only preview:
	// ApprovalRecord.SummaryOnly), without its context and arguments,
	// which are the batch's (RequestedApprovals puts them back). It is
	// written once, by that write, so that the event is durable in the
	// turn's log and a rebuild reads the requests from there (issue 36:
	// one write per fact). Nil on every other write: a record read back
	// from a turn log carries none (pipeline/store), so no later write
	// repeats it.
	Requested []*ApprovalRecord `msgpack:"requested,omitempty"`
	// Decided, on the write that moves a version 2 batch to started only
	// (its turn log's started event), are the decisions of its approvals
	// that the barrier passed on, each as its DecidedEvent (DecidedOf the
	// decided record the redriver read). A decision sent to the approver
	// as a request is stored by no stream but the approvals bucket's
	// (docs/protocol.md §9.2): this copy, in the same write that starts
	// the batch, is what a rebuild finds of it when that bucket is lost.
	// Nil on every other write: a record read back from a turn log
	// carries none (pipeline/store), so no later write repeats it.
	Decided []*DecidedEvent `msgpack:"decided,omitempty"`
	// OrderSeq and OrderAfter place the batch in its session's order
	// (docs/protocol.md §5.4): OrderSeq is the TOLLGATE_TURNS sequence of
	// the order entry its turn came as, OrderAfter the turn of the entry
	// before that one ("" for the session's first entry). Zero and empty
	// on a batch whose turn did not come as an entry (a planner's step
	// batch, a due follow-up, a turn an earlier version accepted on the
	// accepted subject) and on every batch an earlier version wrote. Set
	// by the batch's first write and never changed: whoever ends the
	// batch finds the session's next entry after OrderSeq.
	OrderSeq   uint64 `msgpack:"order_seq,omitempty"`
	OrderAfter string `msgpack:"order_after,omitempty"`

	// legacy marks a record read as version 1 (BatchRecordV1): its calls'
	// claims are in KV bucket tollgate_claims, and it is written back as
	// version 1, never with Claims.
	legacy bool
	// bucketed marks a record read from KV bucket tollgate_batches, where
	// batches were kept before the turn logs: it is written back there
	// (pipeline/store, Batches). A version 1 record is always bucketed.
	// The bytes are the same wherever a record is kept.
	bucketed bool
}

// CallClaim is a call's execution claim in its batch record: the engine
// (the worker, unique per process and start) that claimed it, and when.
type CallClaim struct {
	Worker    string    `msgpack:"worker"`
	ClaimedAt time.Time `msgpack:"claimed_at"`
}

// Legacy reports whether b was read as a version 1 record, whose claims
// are kept in tollgate_claims (see DecodeBatch).
func (b *BatchRecord) Legacy() bool { return b.legacy }

// Bucketed reports whether b is kept in KV bucket tollgate_batches (read
// from it, or a version 1 record) rather than in its turn's log.
func (b *BatchRecord) Bucketed() bool { return b.bucketed || b.legacy }

// ClaimOf returns the claim of call i, nil when it has none.
func (b *BatchRecord) ClaimOf(i int) *CallClaim {
	if i < 0 || i >= len(b.Claims) {
		return nil
	}
	return b.Claims[i]
}

// SetClaim sets the claim of call i (b must not be Legacy).
func (b *BatchRecord) SetClaim(i int, c *CallClaim) {
	if len(b.Claims) < len(b.Calls) {
		b.Claims = append(b.Claims, make([]*CallClaim, len(b.Calls)-len(b.Claims))...)
	}
	b.Claims[i] = c
}

// TurnState is the terminal state of a turn.
type TurnState string

const (
	TurnCompleted TurnState = "completed"
	TurnFailed    TurnState = "failed"
)

// ReplyTarget is where a turn's results go: always the TurnContext's own
// transport, channel and thread.
type ReplyTarget struct {
	Transport string  `msgpack:"transport"`
	Channel   Channel `msgpack:"channel"`
}

// TurnOutcome is published once per turn on tollgate.event.turn.outcome when
// its batch reaches a terminal state.
type TurnOutcome struct {
	V          Version      `msgpack:"v"`
	TurnID     string       `msgpack:"turn_id"`
	SessionID  string       `msgpack:"session_id"`
	State      TurnState    `msgpack:"state"`
	Code       Code         `msgpack:"code,omitempty"`
	Reason     string       `msgpack:"reason,omitempty"`
	Results    []ToolResult `msgpack:"results"`
	Reply      ReplyTarget  `msgpack:"reply"`
	Audience   Audience     `msgpack:"audience"`
	FinishedAt time.Time    `msgpack:"finished_at"`
}

// SessionRecord serialises a session's batches: Active is the turn whose
// batch holds the session; Queue holds later turns in arrival order. Kept in
// KV bucket tollgate_sessions under SessionKey(session id).
type SessionRecord struct {
	V         Version   `msgpack:"v"`
	SessionID string    `msgpack:"session_id"`
	Active    string    `msgpack:"active"`
	Queue     []string  `msgpack:"queue"`
	UpdatedAt time.Time `msgpack:"updated_at"`
	// InboundSeq is the session's arrival watermark: every inbound message
	// of the session (TOLLGATE_INBOUND sequence) up to it has become a turn
	// that is queued, running or finished, or never will be one. The
	// executor admits turns to the queue in this order (see
	// pipeline/sessionorder). Zero for records written before it.
	InboundSeq uint64 `msgpack:"inbound_seq,omitempty"`
}

// ExecutionClaim is created (KV create, so exactly one wins) before a tool
// call runs, in bucket tollgate_claims under the call id. Result is filled in
// once the tool returns. A claim without a result older than the claim lease
// means the tool may have run and its result was lost.
type ExecutionClaim struct {
	V          Version     `msgpack:"v"`
	CallID     string      `msgpack:"call_id"`
	TurnID     string      `msgpack:"turn_id"`
	Tool       string      `msgpack:"tool"`
	ArgsDigest string      `msgpack:"args_digest"`
	Worker     string      `msgpack:"worker"`
	ClaimedAt  time.Time   `msgpack:"claimed_at"`
	Result     *ToolResult `msgpack:"result,omitempty"`
}

// NoticeKind says what a TurnNotice announces.
type NoticeKind string

const (
	// NoticeReady: the turn's session is free; the executor may run its
	// queued batch. Published on tollgate.turn.ready.<session key>.
	NoticeReady NoticeKind = "ready"
	// NoticeAwaiting: the batch now waits on approvals; the redriver
	// evaluates its barrier (some may already be decided). Published on
	// tollgate.event.batch.awaiting.<turn id>.
	NoticeAwaiting NoticeKind = "awaiting"
)

// TurnNotice is a small control message naming a turn. Its payload carries
// no authority: receivers load the batch record by turn id.
type TurnNotice struct {
	V         Version    `msgpack:"v"`
	TurnID    string     `msgpack:"turn_id"`
	SessionID string     `msgpack:"session_id"`
	Kind      NoticeKind `msgpack:"kind"`
	At        time.Time  `msgpack:"at"`
	// Approvals and Results, on an awaiting notice from the executor, are
	// the batch record's as it started waiting (same length as its calls).
	// They are a snapshot for rebuilding the record from the streams
	// (pipeline/replay): the results of calls that ran or were refused
	// before the batch waited are in no other event until its outcome.
	// Receivers still load the batch by turn id; these are never authority.
	Approvals []string      `msgpack:"approvals,omitempty"`
	Results   []*ToolResult `msgpack:"results,omitempty"`
}

// Version is a record's schema version, the "v" field. Decoding rejects a
// value that does not fit (instead of wrapping it around), so no out-of-range
// number can alias a supported version.
type Version uint16

// DecodeMsgpack implements msgpack.CustomDecoder.
func (v *Version) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeInt64()
	if err != nil {
		return fmt.Errorf("v: %w", err)
	}
	if n < 0 || n > math.MaxUint16 {
		return fmt.Errorf("v: %d is out of range", n)
	}
	*v = Version(n)
	return nil
}
