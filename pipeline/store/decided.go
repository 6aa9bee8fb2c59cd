package store

import (
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// RewriteHeader marks a write of a bucket that repeats a record rather than
// changing it: Retire's ("retire"), which writes an ended record again
// with its TTL. A reader of a bucket's stream that takes a revision for a
// new fact passes such a message over (DecidedOf).
const RewriteHeader = "Tollgate-Rewrite"

// RewriteRetire is RewriteHeader's value on Retire's writes.
const RewriteRetire = "retire"

// DecidedOf is the decided event that a message of the approvals bucket's
// stream (topology.StreamApprovals; subject, headers and data as stored)
// stands for, when it is an approval's decision: a revision whose record
// has left pending (approved, denied, expired or abandoned). The event is
// the projection of the record (schemas.DecidedOf): byte for byte
// (schemas.Encode) the approval.decided event an earlier version
// published for that decision, less Repeat, which only the approver's
// answer to a repeated decision carries.
//
// A decided record is never changed again, only written again with its
// TTL (Retire, marked RewriteHeader): so each approval's decision is one
// revision, and a reader that follows the stream hears it once. DecidedOf
// answers nil, nil for every other message: a pending record (created, or
// holding a vote; only its version and status are read), a delete or purge
// marker, a rewrite, a version 1 record (an earlier version's, whose
// decision it published). A message that
// does not decode, or holds the record of another approval than its
// subject names, is an error with a code (schemas.CodeMalformed or
// the decoder's), never guessed at: a reader logs and passes it over.
func DecidedOf(subject string, h nats.Header, data []byte) (*schemas.DecidedEvent, error) {
	d, err := DecisionOf(subject, h, data)
	if err != nil || d == nil {
		return nil, err
	}
	return schemas.DecidedOf(d.Record), nil
}

// Decision is an approval's decision as its revision holds it
// (DecisionOf).
type Decision struct {
	// Record is the decided approval record, decoded and checked whole.
	// A decided record never changes again, so it is the approval as any
	// later read finds it while the key lasts.
	Record *schemas.ApprovalRecord
	// Retained says that the revision was written with a TTL (the
	// approvals bucket's retention started with the decision): retiring
	// the approval (Bucket.Retire) has nothing to write, nor to read.
	Retained bool
}

// DecisionOf is DecidedOf's record: the decision that a message of the
// approvals bucket's stream holds, nil, nil for every message DecidedOf
// answers nil, and DecidedOf's errors.
func DecisionOf(subject string, h nats.Header, data []byte) (*Decision, error) {
	if h.Get(kvOperationHeader) != "" || h.Get(RewriteHeader) != "" {
		return nil, nil
	}
	id, ok := strings.CutPrefix(subject, topology.ApprovalRevisionPrefix)
	if !ok {
		return nil, schemas.Errorf(schemas.CodeMalformed, "%s is not an approval's revision subject", subject)
	}
	// The most frequent revision is a pending record (each approval's
	// creation, each vote): no decision. Its status is read first, the
	// rest skipped; only a record that may be decided is decoded and
	// checked whole.
	var head struct {
		V      schemas.Version        `msgpack:"v"`
		Status schemas.ApprovalStatus `msgpack:"status"`
	}
	if msgpack.Unmarshal(data, &head) == nil && head.V == schemas.ApprovalVersion && head.Status == schemas.ApprovalPending {
		return nil, nil
	}
	rec, legacy, err := schemas.DecodeApproval(data)
	switch {
	case err != nil:
		return nil, err
	case legacy != nil:
		// A version 1 record: an earlier version's, which published its
		// decision; this one restores such a record to the current
		// version before it writes it (the approver's compatibility
		// path), so its own decisions are never version 1.
		return nil, nil
	}
	if rec.ApprovalID != id {
		return nil, schemas.Errorf(schemas.CodeMalformed, "the revision at %s holds approval %q", subject, rec.ApprovalID)
	}
	return &Decision{Record: rec, Retained: h.Get(jetstream.MsgTTLHeader) != ""}, nil
}
