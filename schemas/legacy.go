package schemas

import "time"

// ApprovalLegacyVersion is the schema version of ApprovalRecordV1.
const ApprovalLegacyVersion = 1

// ApprovalRecordV1 is the version 1 shape of an approval record, written
// before the TurnContext was persisted with it: instead of the context it
// carries copies of a few authority fields (transport, sender, channel,
// audience, trust boundary). It is read only; the one compatibility path
// (pipeline/legacy) turns it into an ApprovalRecord with a restored,
// legacy-marked context, or rejects it with LEGACY_CONTEXT_INCOMPLETE.
type ApprovalRecordV1 struct {
	V             Version        `msgpack:"v"`
	ApprovalID    string         `msgpack:"approval_id"`
	TurnID        string         `msgpack:"turn_id"`
	SessionID     string         `msgpack:"session_id"`
	CallID        string         `msgpack:"call_id"`
	Tool          string         `msgpack:"tool"`
	Args          string         `msgpack:"args"`
	ArgsDigest    string         `msgpack:"args_digest"`
	PolicyVersion string         `msgpack:"policy_version"`
	Options       []string       `msgpack:"options"`
	Status        ApprovalStatus `msgpack:"status"`
	RequestedAt   time.Time      `msgpack:"requested_at"`
	ExpiresAt     time.Time      `msgpack:"expires_at"`
	Decision      *DecisionInfo  `msgpack:"decision,omitempty"`

	// The copied authority fields. Any may be missing in old data.
	Transport     string   `msgpack:"transport,omitempty"`
	Sender        *Sender  `msgpack:"sender,omitempty"`
	Channel       *Channel `msgpack:"channel,omitempty"`
	Audience      Audience `msgpack:"audience,omitempty"`
	TrustBoundary string   `msgpack:"trust_boundary,omitempty"`
}

func (a *ApprovalRecordV1) schemaVersion() Version  { return a.V }
func (a *ApprovalRecordV1) currentVersion() Version { return ApprovalLegacyVersion }
func (a *ApprovalRecordV1) stampVersion()           { a.V = ApprovalLegacyVersion }

// validate checks what every record needs to be addressed at all; whether
// the authority fields suffice is the compatibility path's decision.
func (a *ApprovalRecordV1) validate() error {
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

// DecodeApproval decodes a stored approval record of either version: the
// current one (rec), or version 1 (legacy, for the compatibility path to
// restore). Any other version fails with SCHEMA_VERSION_UNSUPPORTED; it is
// never guessed.
func DecodeApproval(b []byte) (rec *ApprovalRecord, legacy *ApprovalRecordV1, err error) {
	rec, err = Decode[ApprovalRecord](b)
	if err == nil || CodeOf(err) != CodeSchemaVersionUnsupported {
		return rec, nil, err
	}
	old, lerr := Decode[ApprovalRecordV1](b)
	if lerr == nil {
		return nil, old, nil
	}
	if CodeOf(lerr) == CodeSchemaVersionUnsupported {
		return nil, nil, err // neither version: report it against the current one
	}
	return nil, nil, lerr
}

// SameAuthority reports whether a and b grant the same authority: the same
// turn, session, requester, transport, channel, audience and trust boundary.
// It is how a legacy-restored context (which has no ingest provenance) is
// matched against the context its batch persisted.
func SameAuthority(a, b *TurnContext) bool {
	if a == nil || b == nil {
		return false
	}
	return a.TurnID == b.TurnID && a.SessionID == b.SessionID &&
		a.Requester.Principal == b.Requester.Principal && a.Requester.SenderID == b.Requester.SenderID &&
		a.Requester.Kind == b.Requester.Kind && a.Requester.Verified == b.Requester.Verified &&
		a.Transport == b.Transport && a.Channel == b.Channel &&
		a.Audience == b.Audience && a.TrustBoundary == b.TrustBoundary
}

// BatchLegacyVersion is the schema version of BatchRecordV1.
const BatchLegacyVersion = 1

// BatchRecordV1 is the version 1 shape of a batch record: the fields of
// BatchRecord but Claims. Its calls' execution claims are records of their
// own in KV bucket tollgate_claims (ExecutionClaim). It is read through
// DecodeBatch only, which returns it as a BatchRecord marked Legacy: the
// stages then claim its calls in tollgate_claims, as the version that
// wrote it did, and write it back as version 1, so that a claim made
// before the upgrade is never missed.
type BatchRecordV1 BatchRecord

func (b *BatchRecordV1) schemaVersion() Version  { return b.V }
func (b *BatchRecordV1) currentVersion() Version { return BatchLegacyVersion }
func (b *BatchRecordV1) stampVersion()           { b.V = BatchLegacyVersion }
func (b *BatchRecordV1) validate() error {
	if len(b.Claims) != 0 {
		return Errorf(CodeInvalidInput, "a version %d batch record has no claims", BatchLegacyVersion)
	}
	return (*BatchRecord)(b).validate()
}

// DecodeBatch decodes a stored batch record of either version: the current
// one, or version 1, returned marked Legacy (see BatchRecordV1). Any other
// version fails with SCHEMA_VERSION_UNSUPPORTED; it is never guessed.
func DecodeBatch(data []byte) (*BatchRecord, error) {
	rec, err := Decode[BatchRecord](data)
	if err == nil || CodeOf(err) != CodeSchemaVersionUnsupported {
		return rec, err
	}
	old, lerr := Decode[BatchRecordV1](data)
	switch {
	case lerr == nil:
		b := (*BatchRecord)(old)
		b.legacy = true
		return b, nil
	case CodeOf(lerr) == CodeSchemaVersionUnsupported:
		return nil, err // neither version: report it against the current one
	}
	return nil, lerr
}

// AsLegacyBatch returns b marked as a version 1 record, without claims
// or outcome or a place in a session's order (for tests and tools that
// write what an earlier version wrote).
func AsLegacyBatch(b *BatchRecord) *BatchRecord {
	c := *b
	c.Claims, c.Outcome, c.legacy = nil, nil, true
	c.OrderSeq, c.OrderAfter = 0, ""
	return &c
}

// AsCurrentBatch returns b as a current (version 2) record, with the same
// claims: for a tool that knows b's claims are not in tollgate_claims
// (pipeline/replay, merging a rebuilt record into the one KV holds). It
// stays where b is kept (Bucketed).
func AsCurrentBatch(b *BatchRecord) *BatchRecord {
	c := *b
	c.bucketed = b.Bucketed()
	c.legacy = false
	return &c
}

// AsBucketedBatch returns b marked as kept in KV bucket tollgate_batches
// (Bucketed), as the version before the turn logs wrote it: without an
// outcome (that version only published it) and without a place in a
// session's order (for tests and tools).
func AsBucketedBatch(b *BatchRecord) *BatchRecord {
	c := *b
	c.Outcome, c.bucketed = nil, true
	c.OrderSeq, c.OrderAfter = 0, ""
	return &c
}

// DecodeBucketedBatch is DecodeBatch for a record read from KV bucket
// tollgate_batches: the record is returned marked Bucketed.
func DecodeBucketedBatch(data []byte) (*BatchRecord, error) {
	b, err := DecodeBatch(data)
	if b != nil {
		b.bucketed = true
	}
	return b, err
}
