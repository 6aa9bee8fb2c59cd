// Package legacy is the one compatibility path for records of an older
// schema version (safety rule 9). Today that is the version 1 approval
// record, written before the TurnContext was persisted with each approval:
// it carries only copies of some authority fields.
//
// Restore rebuilds a TurnContext from those copies only when every authority
// field it needs is present and consistent; it never fills a gap from a
// default, the policy or live transport state. The restored context is
// marked LegacyRestored, sealed (so the rest of the pipeline verifies it like
// any other, and a record written back keeps the mark under the seal),
// logged and counted (tollgate_legacy_restored_total). Otherwise the record
// is refused with LEGACY_CONTEXT_INCOMPLETE and nothing runs on it.
//
// A legacy record is upgraded in place (version 2, with the restored
// context) the next time a stage writes it: a decision or an expiry.
package legacy

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Restorer decodes approval records of any supported version.
type Restorer struct {
	keys    *seal.KeyRing
	log     *slog.Logger
	results *prometheus.CounterVec
}

// New returns a Restorer that seals restored contexts with keys. Its metric
// tollgate_legacy_restored_total{result="restored|incomplete"} is
// registered with reg when reg is not nil.
func New(keys *seal.KeyRing, log *slog.Logger, reg prometheus.Registerer) (*Restorer, error) {
	if keys == nil || log == nil {
		return nil, errors.New("legacy: keys and logger are required")
	}
	r := &Restorer{keys: keys, log: log, results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_legacy_restored_total",
		Help: "Version 1 approval records read through the compatibility path, by result (restored, incomplete).",
	}, []string{"result"})}
	if err := metrics.Register(reg, &r.results); err != nil {
		return nil, fmt.Errorf("legacy: %w", err)
	}
	return r, nil
}

// DecodeApproval decodes a stored approval record. A current record is
// returned as is; a version 1 record goes through Restore. Errors are
// *schemas.Error: MALFORMED_PAYLOAD, SCHEMA_VERSION_UNSUPPORTED (any other
// version), LEGACY_CONTEXT_INCOMPLETE, ...
func (r *Restorer) DecodeApproval(b []byte) (*schemas.ApprovalRecord, error) {
	rec, old, err := schemas.DecodeApproval(b)
	if err != nil || old == nil {
		return rec, err
	}
	return r.Restore(old)
}

// Restore turns a version 1 approval record into a current one with a
// restored, legacy-marked, sealed TurnContext, or fails with
// LEGACY_CONTEXT_INCOMPLETE. It is the only function that reads version 1
// authority fields.
func (r *Restorer) Restore(old *schemas.ApprovalRecordV1) (*schemas.ApprovalRecord, error) {
	tc, err := restoreContext(old)
	if err == nil {
		err = r.keys.Seal(tc)
	}
	if err != nil {
		r.results.WithLabelValues("incomplete").Inc()
		r.log.Warn("legacy approval record refused", "approval", old.ApprovalID, "turn", old.TurnID, "err", err)
		if schemas.CodeOf(err) != schemas.CodeLegacyContextIncomplete {
			err = &schemas.Error{Code: schemas.CodeLegacyContextIncomplete, Reason: err.Error(), Err: err}
		}
		return nil, err
	}
	r.results.WithLabelValues("restored").Inc()
	r.log.Warn("legacy approval record restored through the compatibility path",
		"approval", old.ApprovalID, "turn", old.TurnID, "principal", tc.Requester.Principal, "audience", tc.Audience)
	return &schemas.ApprovalRecord{
		V: schemas.ApprovalLegacyVersion, ApprovalID: old.ApprovalID, TurnID: old.TurnID, SessionID: old.SessionID,
		CallID: old.CallID, Context: tc, Tool: old.Tool, Args: old.Args, ArgsDigest: old.ArgsDigest,
		PolicyVersion: old.PolicyVersion, Options: old.Options, Status: old.Status,
		RequestedAt: old.RequestedAt, ExpiresAt: old.ExpiresAt, Decision: old.Decision,
	}, nil
}

// restoreContext builds the context from the copied fields, or names the
// first one missing or inconsistent.
func restoreContext(old *schemas.ApprovalRecordV1) (*schemas.TurnContext, error) {
	incomplete := func(format string, args ...any) error {
		return schemas.Errorf(schemas.CodeLegacyContextIncomplete, "legacy approval %s: "+format, append([]any{old.ApprovalID}, args...)...)
	}
	switch {
	case old.SessionID == "":
		return nil, incomplete("no session_id")
	case old.Transport == "":
		return nil, incomplete("no transport")
	case old.Sender == nil || old.Sender.ID == "" || old.Sender.Kind == "":
		return nil, incomplete("no sender (id and kind)")
	case old.Channel == nil || old.Channel.ID == "" || old.Channel.Kind == "":
		return nil, incomplete("no channel (id and kind)")
	case old.Audience == "":
		return nil, incomplete("no audience")
	case old.TrustBoundary == "":
		return nil, incomplete("no trust_boundary")
	}
	// The audience was copied from the channel once; if they disagree, one
	// was edited and neither can be trusted.
	if want, err := schemas.AudienceOf(old.Channel.Kind); err != nil || want != old.Audience {
		return nil, incomplete("audience %q does not match channel kind %q", old.Audience, old.Channel.Kind)
	}
	if schemas.TurnIDOfApproval(old.ApprovalID) != old.TurnID {
		return nil, incomplete("approval id does not belong to turn %s", old.TurnID)
	}
	tc := &schemas.TurnContext{
		V:         schemas.TurnContextVersion,
		SessionID: old.SessionID,
		TurnID:    old.TurnID,
		Requester: schemas.Requester{
			Principal: schemas.Principal(old.Transport, old.Sender.ID), SenderID: old.Sender.ID,
			Display: old.Sender.Display, Kind: old.Sender.Kind, Verified: old.Sender.Verified,
		},
		Transport:     old.Transport,
		Channel:       *old.Channel,
		Audience:      old.Audience,
		TrustBoundary: old.TrustBoundary,
		// A restored context never prompts anyone again (follow-up work
		// under it cannot ask for approvals): fail closed.
		Interactive:    false,
		Provenance:     schemas.Provenance{Transport: old.Transport, ReceivedAt: old.RequestedAt.UTC(), IngestedBy: "legacy-compat"},
		CreatedAt:      old.RequestedAt.UTC(),
		LegacyRestored: true,
	}
	if err := tc.Check(); err != nil {
		return nil, incomplete("%v", err)
	}
	return tc, nil
}
