package schemas

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/reveal"
)

// Input limits. They bound what a transport or decider can make a worker
// hold in memory and what ends up in KV.
const (
	MaxIDBytes   = 256
	MaxTextBytes = 32 << 10
	MaxCalls     = 32
	MaxArgsBytes = 16 << 10
	// MaxTotalArgsBytes bounds the arguments of all calls of one message,
	// which the batch record holds together with their results.
	MaxTotalArgsBytes = 256 << 10
	MaxNoteBytes      = 4 << 10
	maxNameBytes      = 64
	maxShortBytes     = 128
)

// checkString enforces a byte limit, valid UTF-8 and no control characters
// (other than tab and newline when multiline is set).
func checkString(field, s string, limit int, required, multiline bool) error {
	if s == "" {
		if required {
			return Errorf(CodeInvalidInput, "%s is required", field)
		}
		return nil
	}
	if len(s) > limit {
		return Errorf(CodePayloadTooLarge, "%s is %d bytes, limit %d", field, len(s), limit)
	}
	if !utf8.ValidString(s) {
		return Errorf(CodeInvalidInput, "%s is not valid UTF-8", field)
	}
	for _, r := range s {
		if unicode.IsControl(r) && !(multiline && (r == '\n' || r == '\t' || r == '\r')) {
			return Errorf(CodeInvalidInput, "%s contains control character %U", field, r)
		}
	}
	return nil
}

// checkPrincipal is checkString for a principal id (a sender's id, a
// decider's, a requester's principal): also no character a person cannot
// see or that reorders text (reveal.Flagged), since an id with one reads as
// another ("al\u200Bice" as "alice"). It returns CodeInvalidInput.
func checkPrincipal(field, s string, limit int) error {
	if err := checkString(field, s, limit, true, false); err != nil {
		return err
	}
	for _, r := range s {
		if reveal.Flagged(r) {
			return Errorf(CodeInvalidInput, "%s contains invisible or direction-changing character %U", field, r)
		}
	}
	return nil
}

// checkName enforces a lower-case identifier: [a-z0-9_.-]{1,64}.
func checkName(field, s string) error {
	if s == "" {
		return Errorf(CodeInvalidInput, "%s is required", field)
	}
	if len(s) > maxNameBytes {
		return Errorf(CodeInvalidInput, "%s is longer than %d bytes", field, maxNameBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return Errorf(CodeInvalidInput, "%s %q: only a-z 0-9 _ - . are allowed", field, s)
		}
	}
	return nil
}

// CheckToolName reports whether name is a valid tool name, by the rule every
// proposed call and every policy entry follows: [a-z0-9_.-]{1,64}. It
// returns an *Error with CodeInvalidInput.
func CheckToolName(name string) error { return checkName("tool", name) }

// checkTransport enforces a transport name: [a-z0-9_-]{1,64}. Unlike tool
// names it may not contain '.', because it is one NATS subject token: with a
// dot, a transport allowed tollgate.decision.submit.slack.> could publish as
// "slack.enterprise".
func checkTransport(field, s string) error {
	if err := checkName(field, s); err != nil {
		return err
	}
	if strings.IndexByte(s, '.') >= 0 {
		return Errorf(CodeInvalidInput, "%s %q: '.' is not allowed in a transport name", field, s)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (k ChannelKind) valid() bool {
	return k == ChannelDM || k == ChannelPrivate || k == ChannelPublic
}

func (a Audience) valid() bool {
	return a == AudiencePersonal || a == AudienceTeam || a == AudiencePublic
}

func (k SenderKind) valid() bool {
	return k == SenderUser || k == SenderBot || k == SenderService
}

// member runs check on field's member name, building the member's full name
// (field.name) only when it fails: the contexts in every decoded record
// are validated, and the name is needed only in an error.
func member(field, name string, check func(field string) error) error {
	if check(name) == nil {
		return nil
	}
	return check(field + "." + name)
}

func (c Channel) check(field string) error {
	if err := member(field, "id", func(f string) error { return checkString(f, c.ID, MaxIDBytes, true, false) }); err != nil {
		return err
	}
	if !c.Kind.valid() {
		return Errorf(CodeInvalidInput, "%s.kind %q: want dm, private or public", field, c.Kind)
	}
	return member(field, "thread", func(f string) error { return checkString(f, c.Thread, MaxIDBytes, false, false) })
}

func (s Sender) check(field string) error {
	if !s.Kind.valid() {
		return Errorf(CodeInvalidInput, "%s.kind %q: want user, bot or service", field, s.Kind)
	}
	if err := member(field, "id", func(f string) error { return checkPrincipal(f, s.ID, MaxIDBytes) }); err != nil {
		return err
	}
	return member(field, "display", func(f string) error { return checkString(f, s.Display, maxShortBytes, false, false) })
}

func (m *InboundMessage) validate() error {
	if err := firstErr(
		checkTransport("transport", m.Transport),
		checkString("message_id", m.MessageID, MaxIDBytes, true, false),
		checkString("session_id", m.SessionID, MaxIDBytes, true, false),
		m.Sender.check("sender"),
		m.Channel.check("channel"),
		checkString("text", m.Text, MaxTextBytes, false, true),
	); err != nil {
		return err
	}
	if len(m.Calls) > MaxCalls {
		return Errorf(CodePayloadTooLarge, "%d calls, limit %d", len(m.Calls), MaxCalls)
	}
	total := 0
	for i, c := range m.Calls {
		if err := checkName(fmt.Sprintf("calls[%d].tool", i), c.Tool); err != nil {
			return err
		}
		if len(c.Args) > MaxArgsBytes {
			return Errorf(CodePayloadTooLarge, "calls[%d].args is %d bytes, limit %d", i, len(c.Args), MaxArgsBytes)
		}
		total += len(c.Args)
	}
	if total > MaxTotalArgsBytes {
		return Errorf(CodePayloadTooLarge, "args of all calls are %d bytes, limit %d", total, MaxTotalArgsBytes)
	}
	return nil
}

// Check reports whether c is a usable authority: present, of the current
// version and complete. It returns an *Error with CodeTurnContextMissing,
// CodeSchemaVersionUnsupported or CodeTurnContextInvalid. Callers fail closed
// on any error.
func (c *TurnContext) Check() error {
	if c == nil {
		return Errorf(CodeTurnContextMissing, "no TurnContext was persisted")
	}
	if c.V != TurnContextVersion {
		return Errorf(CodeSchemaVersionUnsupported, "TurnContext version %d, want %d", c.V, TurnContextVersion)
	}
	if err := c.validate(); err != nil {
		return &Error{Code: CodeTurnContextInvalid, Reason: err.Error(), Err: err}
	}
	return nil
}

// CheckFor is Check plus a check that c is the authority of turnID: c was
// captured for turnID, or turnID is work that inherits c unchanged: a
// follow-up a call of c's turn scheduled (FollowUpTurnID) or a step batch of
// c's turn's agent loop (PlannerStepTurnID), in any chain (DescendsFrom).
func (c *TurnContext) CheckFor(turnID string) error {
	if err := c.Check(); err != nil {
		return err
	}
	if c.TurnID != turnID && !DescendsFrom(turnID, c.TurnID) {
		return Errorf(CodeTurnContextMismatch, "TurnContext is for turn %q, not %q", c.TurnID, turnID)
	}
	return nil
}

func (c *TurnContext) validate() error {
	if !c.Audience.valid() {
		return Errorf(CodeInvalidInput, "audience %q: want personal, team or public", c.Audience)
	}
	return firstErr(
		checkString("session_id", c.SessionID, MaxIDBytes, true, false),
		checkString("turn_id", c.TurnID, MaxIDBytes, true, false),
		checkPrincipal("requester.principal", c.Requester.Principal, 2*MaxIDBytes),
		checkPrincipal("requester.sender_id", c.Requester.SenderID, MaxIDBytes),
		checkTransport("transport", c.Transport),
		c.Channel.check("channel"),
		checkString("trust_boundary", c.TrustBoundary, maxShortBytes, true, false),
		c.Seal.check(),
		c.checkSessionKey(),
	)
}

// checkSessionKey: a context's session key, when it has one, is the one its
// transport and session id give (SessionKey); a context may not name
// another transport's session.
func (c *TurnContext) checkSessionKey() error {
	if c.SessionKey == "" || c.SessionKey == SessionKey(c.Transport, c.SessionID) {
		return nil
	}
	return Errorf(CodeInvalidInput, "session_key %q is not the key of session %q of transport %q", c.SessionKey, c.SessionID, c.Transport)
}

func (s *Seal) check() error {
	if s == nil {
		return nil // an unsealed context is well-formed; seal.Verify rejects it
	}
	if len(s.MAC) > 64 {
		return Errorf(CodeInvalidInput, "seal.mac is %d bytes, limit 64", len(s.MAC))
	}
	return checkString("seal.kid", s.KeyID, maxShortBytes, true, false)
}

func (t *AcceptedTurn) validate() error {
	if err := checkString("turn_id", t.TurnID, MaxIDBytes, true, false); err != nil {
		return err
	}
	if len(t.Calls) > MaxCalls {
		return Errorf(CodePayloadTooLarge, "%d calls, limit %d", len(t.Calls), MaxCalls)
	}
	return checkFollowUpDepth(t.FollowUpDepth)
}

func checkFollowUpDepth(d int) error {
	if d < 0 || d > MaxFollowUpDepth {
		return Errorf(CodeInvalidInput, "followup_depth %d: want 0 to %d", d, MaxFollowUpDepth)
	}
	return nil
}

func (d *Decision) validate() error {
	if d.Option == "" {
		return Errorf(CodeInvalidInput, "option is required")
	}
	if err := firstErr(
		checkString("decision_id", d.DecisionID, MaxIDBytes, true, false),
		checkString("approval_id", d.ApprovalID, MaxIDBytes, true, false),
		checkTransport("transport", d.Transport),
		d.Decider.check("decider"),
		checkName("option", d.Option),
		checkString("args_digest", d.ArgsDigest, maxShortBytes, false, false),
		checkString("note", d.Note, MaxNoteBytes, false, true),
	); err != nil {
		return err
	}
	if d.Channel != nil {
		return d.Channel.check("channel")
	}
	return nil
}

func (s ApprovalStatus) valid() bool { return s == ApprovalPending || s.Decided() }

func (a *ApprovalRecord) validate() error {
	if !a.Status.valid() {
		return Errorf(CodeInvalidInput, "status %q is not an approval status", a.Status)
	}
	return firstErr(
		checkString("approval_id", a.ApprovalID, MaxIDBytes, true, false),
		checkString("turn_id", a.TurnID, MaxIDBytes, true, false),
		checkString("call_id", a.CallID, MaxIDBytes, true, false),
		checkName("tool", a.Tool),
	)
}

func (e *DecidedEvent) validate() error {
	if !e.Status.Decided() {
		return Errorf(CodeInvalidInput, "status %q is not a decided status", e.Status)
	}
	return firstErr(
		checkString("approval_id", e.ApprovalID, MaxIDBytes, true, false),
		checkString("turn_id", e.TurnID, MaxIDBytes, true, false),
	)
}

func (r *DecisionRejected) validate() error {
	if r.Code == "" {
		return Errorf(CodeInvalidInput, "code is required")
	}
	return nil
}

func (o *RedriveOutcome) validate() error {
	switch o.Kind {
	case RedriveStarted, RedriveDeferred, RedriveFailed:
	default:
		return Errorf(CodeInvalidInput, "kind %q is not a redrive outcome", o.Kind)
	}
	return checkString("turn_id", o.TurnID, MaxIDBytes, true, false)
}

func (o *TurnOutcome) validate() error {
	if o.State != TurnCompleted && o.State != TurnFailed {
		return Errorf(CodeInvalidInput, "state %q is not a turn state", o.State)
	}
	return checkString("turn_id", o.TurnID, MaxIDBytes, true, false)
}

func (s BatchState) valid() bool {
	switch s {
	case BatchQueued, BatchRunning, BatchAwaiting, BatchStarted, BatchCompleted, BatchFailed:
		return true
	}
	return false
}

func (b *BatchRecord) validate() error {
	if !b.State.valid() {
		return Errorf(CodeInvalidInput, "state %q is not a batch state", b.State)
	}
	if len(b.Calls) > MaxCalls {
		return Errorf(CodePayloadTooLarge, "%d calls, limit %d", len(b.Calls), MaxCalls)
	}
	if len(b.Approvals) != len(b.Calls) || len(b.Results) != len(b.Calls) {
		return Errorf(CodeInvalidInput, "approvals (%d) and results (%d) must match calls (%d)", len(b.Approvals), len(b.Results), len(b.Calls))
	}
	switch {
	case len(b.Claims) != 0 && len(b.Claims) != len(b.Calls):
		return Errorf(CodeInvalidInput, "claims (%d) must be empty or match calls (%d)", len(b.Claims), len(b.Calls))
	case len(b.Claims) != 0 && b.V == BatchLegacyVersion:
		return Errorf(CodeInvalidInput, "a version %d batch record keeps its claims in tollgate_claims, not in the record", BatchLegacyVersion)
	}
	if err := checkPlace(b.OrderSeq, b.OrderAfter); err != nil {
		return err
	}
	for i, c := range b.Claims {
		if c != nil {
			if err := checkString(fmt.Sprintf("claims[%d].worker", i), c.Worker, MaxIDBytes, true, false); err != nil {
				return err
			}
		}
	}
	if err := b.checkOutcome(); err != nil {
		return err
	}
	if err := b.checkRequested(); err != nil {
		return err
	}
	return firstErr(
		checkString("turn_id", b.TurnID, MaxIDBytes, true, false),
		checkFollowUpDepth(b.FollowUpDepth),
	)
}

// checkPlace checks a place in a session's order (order_seq,
// order_after): a turn before it only with the entry's sequence, and a
// turn id.
func checkPlace(seq uint64, after string) error {
	switch {
	case after != "" && seq == 0:
		return Errorf(CodeInvalidInput, "order_after %q without the order_seq of the turn's entry", after)
	case after != "" && !ValidKey(after):
		return Errorf(CodeInvalidInput, "order_after %q is not a turn id", after)
	}
	return nil
}

// checkOutcome: an outcome only on a terminal version 2 record, for its
// own turn and session, in the turn state its batch state gives.
func (b *BatchRecord) checkOutcome() error {
	o := b.Outcome
	if o == nil {
		return nil
	}
	want := TurnCompleted
	if b.State == BatchFailed {
		want = TurnFailed
	}
	switch {
	case !b.State.Terminal():
		return Errorf(CodeInvalidInput, "a %s batch has no outcome yet", b.State)
	case b.V == BatchLegacyVersion:
		return Errorf(CodeInvalidInput, "a version %d batch record carries no outcome (it was published)", BatchLegacyVersion)
	case o.TurnID != b.TurnID || o.SessionID != b.SessionID:
		return Errorf(CodeInvalidInput, "the outcome of turn %s (session %s) in the batch of turn %s (session %s)", o.TurnID, o.SessionID, b.TurnID, b.SessionID)
	case o.V != TurnOutcomeVersion:
		return Errorf(CodeSchemaVersionUnsupported, "outcome version %d, want %d", o.V, TurnOutcomeVersion)
	case o.State != want:
		return Errorf(CodeInvalidInput, "a %s batch with a %s outcome", b.State, o.State)
	case len(o.Results) > MaxCalls:
		return Errorf(CodePayloadTooLarge, "outcome: %d results, limit %d", len(o.Results), MaxCalls)
	}
	return o.validate()
}

// checkRequested: requested approvals only on an awaiting version 2
// record, each one of its own calls' approvals, bound to that call (the
// batch's approval id, call id, tool and argument digest, its turn and
// session), kept without context and arguments, once.
func (b *BatchRecord) checkRequested() error {
	if len(b.Requested) == 0 {
		return nil
	}
	switch {
	case b.State != BatchAwaiting:
		return Errorf(CodeInvalidInput, "a %s batch carries no requested approvals (only the move to awaiting does)", b.State)
	case b.V == BatchLegacyVersion:
		return Errorf(CodeInvalidInput, "a version %d batch record carries no requested approvals (they were published)", BatchLegacyVersion)
	case len(b.Requested) > len(b.Calls):
		return Errorf(CodeInvalidInput, "%d requested approvals for %d calls", len(b.Requested), len(b.Calls))
	}
	seen := make([]bool, len(b.Calls))
	for _, a := range b.Requested {
		if a == nil {
			return Errorf(CodeInvalidInput, "a requested approval is empty")
		}
		i := slices.IndexFunc(b.Calls, func(c ToolCall) bool { return c.CallID == a.CallID })
		switch {
		case i < 0:
			return Errorf(CodeInvalidInput, "requested approval %s is for call %q, not one of the batch's", a.ApprovalID, a.CallID)
		case seen[i]:
			return Errorf(CodeInvalidInput, "call %s has two requested approvals", a.CallID)
		case a.ApprovalID != b.Approvals[i] || a.ApprovalID != ApprovalID(b.TurnID, i):
			return Errorf(CodeInvalidInput, "requested approval %s is not call %d's approval %q", a.ApprovalID, i, b.Approvals[i])
		case a.TurnID != b.TurnID || a.SessionID != b.SessionID:
			return Errorf(CodeInvalidInput, "requested approval %s names turn %s (session %s), not its batch's", a.ApprovalID, a.TurnID, a.SessionID)
		case a.Tool != b.Calls[i].Tool || a.ArgsDigest != b.Calls[i].ArgsDigest:
			return Errorf(CodeInvalidInput, "requested approval %s binds another call than call %d", a.ApprovalID, i)
		case a.Context != nil || a.Args != "":
			return Errorf(CodeInvalidInput, "requested approval %s carries a context or arguments (they are the batch's)", a.ApprovalID)
		case a.V != ApprovalVersion:
			return Errorf(CodeSchemaVersionUnsupported, "requested approval %s version %d, want %d", a.ApprovalID, a.V, ApprovalVersion)
		}
		seen[i] = true
		if err := a.validate(); err != nil {
			return err
		}
	}
	return nil
}

func (s *SessionRecord) validate() error {
	return checkString("session_id", s.SessionID, MaxIDBytes, true, false)
}

func (c *ExecutionClaim) validate() error {
	return firstErr(
		checkString("call_id", c.CallID, MaxIDBytes, true, false),
		checkName("tool", c.Tool),
	)
}

func (n *TurnNotice) validate() error {
	if n.Kind != NoticeReady && n.Kind != NoticeAwaiting {
		return Errorf(CodeInvalidInput, "kind %q is not a notice kind", n.Kind)
	}
	if len(n.Approvals) > MaxCalls || len(n.Approvals) != len(n.Results) {
		return Errorf(CodeInvalidInput, "approvals (%d) and results (%d) must have one entry per call (at most %d)", len(n.Approvals), len(n.Results), MaxCalls)
	}
	return checkString("turn_id", n.TurnID, MaxIDBytes, true, false)
}
