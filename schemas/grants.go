package schemas

import (
	"bytes"
	"io"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Standing grants (docs/protocol.md, "Grants"). A grant option, offered on
// a prompt beside approve and deny, decides the approval it is chosen on
// and also creates a Grant: a record, kept in KV bucket tollgate_grants,
// that decides later calls falling inside its scope without a prompt,
// until it expires or is revoked.

// Grant option names. Every option a prompt offers is approve, deny, or a
// grant option whose name says what it does: "approve-<name>" approves,
// "deny-<name>" denies (the rest of the name is the policy's). A renderer
// can show any option from its name and the approval's Grants offers.
const (
	GrantApprovePrefix = OptionApprove + "-"
	GrantDenyPrefix    = OptionDeny + "-"
)

// IsGrantOption reports whether option names a grant option.
func IsGrantOption(option string) bool {
	return len(option) > len(GrantApprovePrefix) && strings.HasPrefix(option, GrantApprovePrefix) ||
		len(option) > len(GrantDenyPrefix) && strings.HasPrefix(option, GrantDenyPrefix)
}

// OptionEffect is the status a decision with option gives an approval:
// approved for approve and "approve-*", denied for anything else (deny,
// "deny-*"; an option that approves must say so).
func OptionEffect(option string) ApprovalStatus {
	if option == OptionApprove || IsGrantOption(option) && strings.HasPrefix(option, GrantApprovePrefix) {
		return ApprovalApproved
	}
	return ApprovalDenied
}

// Versions of the grant records.
const (
	GrantVersion      = 1
	GrantIndexVersion = 1
	GrantEventVersion = 1
)

// GrantScopeKind is whose later calls a grant covers.
type GrantScopeKind string

const (
	// GrantScopeSession: the requester's calls in the one session the
	// grant was made in.
	GrantScopeSession GrantScopeKind = "session"
	// GrantScopeRequester: the requester's calls in any session (still on
	// the same transport and trust boundary, and no wider audience).
	GrantScopeRequester GrantScopeKind = "requester"
)

// GrantScope is what a grant covers beyond its tool, requester and
// TurnContext: a session or any session of the requester, and optionally
// argument patterns: a path prefix of one argument (PathPrefix ends in
// "/"; see docs/protocol.md for the matching rule) and a set of values of
// one argument. A call is covered only if every pattern set matches.
type GrantScope struct {
	Kind       GrantScopeKind `msgpack:"kind"`
	SessionID  string         `msgpack:"session_id,omitempty"`  // the session, for kind session
	PathField  string         `msgpack:"path_field,omitempty"`  // the argument PathPrefix applies to
	PathPrefix string         `msgpack:"path_prefix,omitempty"` // e.g. "notes/" or "/srv/data/"
	ValueField string         `msgpack:"value_field,omitempty"` // the argument Values applies to
	Values     []string       `msgpack:"values,omitempty"`      // the argument must be one of these strings
}

// GrantOffer is what one grant option of a prompt would create, derived
// from the policy and the call's arguments when the approval was
// requested: the prompt shows Summary, and a renderer may lay out the rest.
type GrantOffer struct {
	Option string         `msgpack:"option"`
	Effect ApprovalStatus `msgpack:"effect"` // approved or denied
	Tool   string         `msgpack:"tool"`
	Scope  GrantScope     `msgpack:"scope"`
	// For is how long the grant lasts from the decision, in nanoseconds on
	// the wire, written in the smallest integer form like every other
	// integer (docs/protocol.md §2.1; EncodeMsgpack). Records written with
	// it as an int64 (0xd3) decode the same.
	For     time.Duration `msgpack:"for"`
	Summary string        `msgpack:"summary"`
}

// grantOfferFields is GrantOffer's fields without tags: EncodeMsgpack
// converts to it, so that a field added to GrantOffer fails to compile
// until EncodeMsgpack writes it.
type grantOfferFields struct {
	Option  string
	Effect  ApprovalStatus
	Tool    string
	Scope   GrantScope
	For     time.Duration
	Summary string
}

// EncodeMsgpack writes o as the map its tags describe, in their order,
// with For in the smallest integer form (msgpack's default writes a
// time.Duration, an int64, always as 0xd3 and 8 bytes). Decoding needs
// no counterpart: any integer form decodes into For.
func (o GrantOffer) EncodeMsgpack(enc *msgpack.Encoder) error {
	f := grantOfferFields(o)
	if err := enc.EncodeMapLen(6); err != nil {
		return err
	}
	for _, kv := range []struct {
		key string
		put func() error
	}{
		{"option", func() error { return enc.EncodeString(f.Option) }},
		{"effect", func() error { return enc.Encode(f.Effect) }},
		{"tool", func() error { return enc.EncodeString(f.Tool) }},
		{"scope", func() error { return enc.Encode(&f.Scope) }},
		{"for", func() error { return enc.EncodeInt(int64(f.For)) }},
		{"summary", func() error { return enc.EncodeString(f.Summary) }},
	} {
		if err := enc.EncodeString(kv.key); err != nil {
			return err
		}
		if err := kv.put(); err != nil {
			return err
		}
	}
	return nil
}

// GrantRevocation records who revoked a grant, when and why.
type GrantRevocation struct {
	By     string    `msgpack:"by"`
	At     time.Time `msgpack:"at"`
	Reason string    `msgpack:"reason,omitempty"`
}

// Grant is a standing decision, kept in KV bucket tollgate_grants under
// GrantID. It is bound to the principal who chose the option, the sealed
// TurnContext of the turn it was chosen on, the tool, the scope, the
// expiry and the policy version. MAC (package seal, KeyRing.SealGrant)
// covers every field but MAC and Revoked: a record that does not verify
// decides nothing. Revoked is outside the MAC on purpose: setting it only
// narrows, and removing it yields the bytes of the record before the
// revocation, which anyone who can write KV could replay anyway
// (docs/security.md).
type Grant struct {
	V             Version          `msgpack:"v"`
	GrantID       string           `msgpack:"grant_id"`
	Option        string           `msgpack:"option"`
	Effect        ApprovalStatus   `msgpack:"effect"`
	Tool          string           `msgpack:"tool"`
	Scope         GrantScope       `msgpack:"scope"`
	Summary       string           `msgpack:"summary"`
	Principal     string           `msgpack:"principal"`
	Assurance     Assurance        `msgpack:"assurance"`
	Context       *TurnContext     `msgpack:"context"`
	ApprovalID    string           `msgpack:"approval_id"`
	DecisionID    string           `msgpack:"decision_id"`
	PolicyVersion string           `msgpack:"policy_version"`
	CreatedAt     time.Time        `msgpack:"created_at"`
	ExpiresAt     time.Time        `msgpack:"expires_at"`
	MAC           *Seal            `msgpack:"mac,omitempty"`
	Revoked       *GrantRevocation `msgpack:"revoked,omitempty"`
}

// GrantUse is set on DecisionInfo when a grant, not a person, decided an
// approval: which grant, and what it covers.
type GrantUse struct {
	GrantID string     `msgpack:"grant_id"`
	Scope   GrantScope `msgpack:"scope"`
	Summary string     `msgpack:"summary"`
}

// GrantIndex lists the grants of one (tool, requester principal), kept in
// tollgate_grants under GrantIndexKey, so that finding the grants that may
// cover a call is one KV get (plus one per listed grant), never a listing
// of keys. It carries no authority: each grant it names is read and
// verified.
type GrantIndex struct {
	V         Version   `msgpack:"v"`
	Tool      string    `msgpack:"tool"`
	Principal string    `msgpack:"principal"`
	Grants    []string  `msgpack:"grants"`
	UpdatedAt time.Time `msgpack:"updated_at"`
}

// MaxGrantsPerIndex bounds a GrantIndex: adding a grant to a full index
// first drops the ones that ended; if it is still full, the oldest goes
// (that grant stops deciding: later calls are prompted again).
const MaxGrantsPerIndex = 32

// GrantEventKind is what a GrantEvent announces.
type GrantEventKind string

const (
	GrantCreated GrantEventKind = "created"
	GrantUsed    GrantEventKind = "used"
	GrantRevoked GrantEventKind = "revoked"
)

// GrantEvent is published on tollgate.event.grant.<kind>.<grant id> for
// every grant made (by the approver), every use (by the executor: an
// approval it decided with the grant) and every revocation.
type GrantEvent struct {
	V       Version        `msgpack:"v"`
	Kind    GrantEventKind `msgpack:"kind"`
	GrantID string         `msgpack:"grant_id"`
	Tool    string         `msgpack:"tool"`
	// Grant is the record as stored, on created and revoked.
	Grant *Grant `msgpack:"grant,omitempty"`
	// ApprovalID, TurnID, CallID and Status are those of the approval the
	// grant decided (used), or was made on (created).
	ApprovalID string         `msgpack:"approval_id,omitempty"`
	TurnID     string         `msgpack:"turn_id,omitempty"`
	CallID     string         `msgpack:"call_id,omitempty"`
	Status     ApprovalStatus `msgpack:"status,omitempty"`
	By         string         `msgpack:"by,omitempty"` // who revoked it
	Reason     string         `msgpack:"reason,omitempty"`
	At         time.Time      `msgpack:"at"`
}

// GrantID is the id of the grant made by decision decisionID on approval
// approvalID: "g-" and 32 hex characters. A redelivered decision makes the
// same grant.
func GrantID(approvalID, decisionID string) string {
	return hashID("g-", 32, "grant", approvalID, decisionID)
}

// GrantIndexKey is the key of the GrantIndex of (tool, principal).
func GrantIndexKey(tool, principal string) string {
	return hashID("gi-", 32, "grant-index", tool, principal)
}

// IsGrantID reports whether key is of GrantID's form (not an index key).
func IsGrantID(key string) bool { return strings.HasPrefix(key, "g-") && ValidKey(key) }

// GrantSealedBytes is the canonical encoding a grant's MAC covers: the
// msgpack encoding of g with MAC and Revoked unset (its Context keeps its
// own seal, which the MAC therefore covers too).
func GrantSealedBytes(g *Grant) ([]byte, error) {
	var b bytes.Buffer
	if err := WriteGrantSealed(&b, g); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteGrantSealed writes GrantSealedBytes(g) to w.
func WriteGrantSealed(w io.Writer, g *Grant) error {
	cp := *g
	cp.MAC, cp.Revoked = nil, nil
	e := encPool.Get().(*encoder)
	defer encPool.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(&cp); err != nil {
		return err
	}
	_, err := w.Write(e.buf.Bytes())
	return err
}

// Ended reports why g decides nothing at now, as a coded error, or nil:
// GRANT_REVOKED once revoked, GRANT_EXPIRED at or after its expiry.
func (g *Grant) Ended(now time.Time) error {
	switch {
	case g.Revoked != nil:
		return Errorf(CodeGrantRevoked, "grant %s was revoked by %s at %s", g.GrantID, g.Revoked.By, g.Revoked.At.UTC().Format(time.RFC3339))
	case !now.Before(g.ExpiresAt):
		return Errorf(CodeGrantExpired, "grant %s expired at %s", g.GrantID, g.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}

func (k GrantScopeKind) valid() bool { return k == GrantScopeSession || k == GrantScopeRequester }

func (s GrantScope) check() error {
	if !s.Kind.valid() {
		return Errorf(CodeInvalidInput, "scope.kind %q: want session or requester", s.Kind)
	}
	if s.Kind == GrantScopeSession && s.SessionID == "" {
		return Errorf(CodeInvalidInput, "scope.session_id is required for a session scope")
	}
	if (s.PathPrefix == "") != (s.PathField == "") {
		return Errorf(CodeInvalidInput, "scope.path_field and scope.path_prefix go together")
	}
	if (len(s.Values) == 0) != (s.ValueField == "") {
		return Errorf(CodeInvalidInput, "scope.value_field and scope.values go together")
	}
	if len(s.Values) > 64 {
		return Errorf(CodePayloadTooLarge, "scope.values has %d entries, limit 64", len(s.Values))
	}
	if s.PathPrefix != "" && !strings.HasSuffix(s.PathPrefix, "/") {
		return Errorf(CodeInvalidInput, "scope.path_prefix %q must end in /", s.PathPrefix)
	}
	return firstErr(
		checkString("scope.session_id", s.SessionID, MaxIDBytes, false, false),
		checkString("scope.path_field", s.PathField, maxNameBytes, false, false),
		checkString("scope.value_field", s.ValueField, maxNameBytes, false, false),
		checkString("scope.path_prefix", s.PathPrefix, MaxIDBytes*4, false, false),
	)
}

func (g *Grant) validate() error {
	if g.Effect != ApprovalApproved && g.Effect != ApprovalDenied {
		return Errorf(CodeInvalidInput, "effect %q: want approved or denied", g.Effect)
	}
	if g.Context == nil {
		return Errorf(CodeTurnContextMissing, "grant has no TurnContext")
	}
	if !IsGrantOption(g.Option) || OptionEffect(g.Option) != g.Effect {
		return Errorf(CodeInvalidInput, "option %q is not a grant option with effect %s", g.Option, g.Effect)
	}
	if g.ExpiresAt.IsZero() {
		return Errorf(CodeInvalidInput, "expires_at is required: every grant expires")
	}
	return firstErr(
		checkString("grant_id", g.GrantID, MaxIDBytes, true, false),
		checkName("option", g.Option),
		checkName("tool", g.Tool),
		g.Scope.check(),
		checkString("summary", g.Summary, MaxNoteBytes, false, false),
		checkString("principal", g.Principal, 2*MaxIDBytes, true, false),
		checkString("approval_id", g.ApprovalID, MaxIDBytes, true, false),
		checkString("decision_id", g.DecisionID, MaxIDBytes, true, false),
		checkString("policy_version", g.PolicyVersion, MaxIDBytes, false, false),
		g.MAC.check(),
	)
}

func (x *GrantIndex) validate() error {
	if len(x.Grants) > MaxGrantsPerIndex {
		return Errorf(CodePayloadTooLarge, "%d grants, limit %d", len(x.Grants), MaxGrantsPerIndex)
	}
	return firstErr(checkName("tool", x.Tool), checkString("principal", x.Principal, 2*MaxIDBytes, true, false))
}

func (e *GrantEvent) validate() error {
	switch e.Kind {
	case GrantCreated, GrantUsed, GrantRevoked:
	default:
		return Errorf(CodeInvalidInput, "kind %q is not a grant event kind", e.Kind)
	}
	return checkString("grant_id", e.GrantID, MaxIDBytes, true, false)
}

func (g *Grant) schemaVersion() Version       { return g.V }
func (g *Grant) currentVersion() Version      { return GrantVersion }
func (g *Grant) stampVersion()                { g.V = GrantVersion }
func (x *GrantIndex) schemaVersion() Version  { return x.V }
func (x *GrantIndex) currentVersion() Version { return GrantIndexVersion }
func (x *GrantIndex) stampVersion()           { x.V = GrantIndexVersion }
func (e *GrantEvent) schemaVersion() Version  { return e.V }
func (e *GrantEvent) currentVersion() Version { return GrantEventVersion }
func (e *GrantEvent) stampVersion()           { e.V = GrantEventVersion }
