package approver

import (
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Effect is what an accepted decision does to its approval; it is the
// result label of tollgate_decisions_total.
type Effect string

const (
	// Applied: the decision moves the approval out of pending.
	Applied Effect = "applied"
	// Vote: an approve counted towards a quorum not yet reached; the
	// approval stays pending.
	Vote Effect = "vote"
	// Idempotent: the decision repeats what the record already holds (the
	// same outcome, or the same principal's counted vote); nothing changes.
	Idempotent Effect = "idempotent"
)

// Verdict is what a decision does to the approval it names, as Authorize
// decides it.
type Verdict struct {
	// Effect of an accepted decision; "" when the decision is rejected.
	Effect Effect
	// Next is the record to store, by compare-and-set on the revision the
	// record given to Authorize was read at; nil: nothing is stored. It is
	// a copy: the record given to Authorize is never changed.
	Next *schemas.ApprovalRecord
	// Quorum is the number of distinct approvals the approval needs: the
	// larger of the one recorded at the request and the policy's now (a
	// deploy that raised it applies to pending approvals; the redriver
	// would refuse a smaller one anyway).
	Quorum int
}

// NotFoundMeaning is what an APPROVAL_NOT_FOUND for a missing record tells
// the decider. A decided approval leaves KV a retention period after its
// turn's batch ended (tollgate.Config.Retention); until then a late
// decision gets APPROVAL_ALREADY_DECIDED (or its idempotent success), after
// it this. Either way nothing runs.
const NotFoundMeaning = "it is unknown, or its turn ended longer ago than the retention period and its record was removed; nothing was decided and nothing runs"

// Authorize decides, without I/O, what decision d does to rec, the approval
// record d names as read from the store (nil: there is none), under policy
// pol, the seal keys and the time now. It is the approver's whole rule: the
// approver reads the record, calls Authorize, stores Verdict.Next by
// compare-and-set (on a conflict it reads again and calls Authorize again)
// and publishes what the verdict says. rec is never changed.
//
// A nil error accepts d. Otherwise the error is a *schemas.Error whose code
// the decider is told, and nothing is stored but a Verdict.Next that moves
// an approval past its expiry to expired. The checks, in this order:
//
//   - APPROVAL_NOT_FOUND: rec is nil (its reason says what that means:
//     NotFoundMeaning), or is the record of another approval than d names;
//     INVALID_INPUT: d is nil, or rec's status is none of schemas'
//     approval statuses;
//   - policy.Policy.MayDecideApproval, with its codes: rec's TurnContext is authentic and its
//     turn's, and d's decider may decide it (DECIDER_NOT_AUTHORIZED);
//   - ARGS_DIGEST_MISMATCH: d carries an argument digest other than the one
//     rec binds (a decision without one is for the call rec binds: the
//     approval id names it; the tool, arguments and policy version it was
//     requested under are rec's, and the redriver checks them against the
//     batch's call before the call runs);
//   - OPTION_NOT_OFFERED: d's option is not among rec's options, or is a
//     grant option the policy no longer offers for rec's call;
//   - on a decided approval: a decision with the outcome already recorded
//     is Idempotent (the approver answers it: no record changes); on an
//     expired one APPROVAL_EXPIRED; otherwise APPROVAL_ALREADY_DECIDED;
//   - APPROVAL_EXPIRED: rec's expiry is at or before now; Next is rec moved
//     to expired by ExpiryPrincipal, to be stored (its revision is the
//     decided event);
//   - accepted: an approve where Quorum is above one counts distinct
//     principals: the same principal's second approve is Idempotent; one
//     that leaves the count below Quorum is a Vote (Next records it, still
//     pending); the one that reaches it is Applied. Any other approve or
//     deny is Applied at once: Next is rec decided by d (its stored
//     revision is the decision's event, docs/protocol.md §4.2b).
func Authorize(rec *schemas.ApprovalRecord, d *schemas.Decision, pol *policy.Policy, keys *seal.KeyRing, now time.Time) (Verdict, error) {
	switch {
	case d == nil:
		return Verdict{}, schemas.Errorf(schemas.CodeInvalidInput, "no decision")
	case rec == nil:
		return Verdict{}, schemas.Errorf(schemas.CodeApprovalNotFound, "no approval %q: %s", d.ApprovalID, NotFoundMeaning)
	case rec.ApprovalID != d.ApprovalID:
		return Verdict{}, schemas.Errorf(schemas.CodeApprovalNotFound, "no approval %q (the record read is approval %q)", d.ApprovalID, rec.ApprovalID)
	case rec.Status != schemas.ApprovalPending && !rec.Status.Decided():
		return Verdict{}, schemas.Errorf(schemas.CodeInvalidInput, "approval %s has status %q", rec.ApprovalID, rec.Status)
	}
	if err := pol.MayDecideApproval(rec, d.Transport, d.Decider, d.Channel, keys); err != nil {
		return Verdict{}, err
	}
	if d.ArgsDigest != "" && d.ArgsDigest != rec.ArgsDigest {
		return Verdict{}, schemas.Errorf(schemas.CodeArgsDigestMismatch, "decision is for arguments %s, approval binds %s", d.ArgsDigest, rec.ArgsDigest)
	}
	if !rec.Offers(d.Option) {
		return Verdict{}, schemas.Errorf(schemas.CodeOptionNotOffered, "option %q was not offered (offered: %v)", d.Option, rec.Options)
	}
	if schemas.IsGrantOption(d.Option) {
		// A grant option must still be one the policy offers for this call:
		// the grant it makes is derived from the policy now, never from
		// what the record says was offered.
		if _, ok := pol.GrantOffer(rec.Tool, d.Option, rec.Context, rec.Args); !ok {
			return Verdict{}, schemas.Errorf(schemas.CodeOptionNotOffered, "policy %s no longer offers grant option %q for this call", pol.Version(), d.Option)
		}
	}
	quorum := max(rec.Quorum, pol.Quorum(rec.Tool, rec.Context))
	want := statusOf(d.Option)
	if rec.Status.Decided() {
		switch rec.Status {
		case want:
			return Verdict{Effect: Idempotent, Quorum: quorum}, nil
		case schemas.ApprovalExpired:
			return Verdict{Quorum: quorum}, rec.Decidable(now)
		default:
			return Verdict{Quorum: quorum}, rec.Decidable(now)
		}
	}
	next := *rec
	if err := rec.Decidable(now); err != nil {
		// Pending, but its expiry has passed (schemas' one rule).
		next.Status = schemas.ApprovalExpired
		next.Decision = &schemas.DecisionInfo{Principal: ExpiryPrincipal, DecidedAt: now}
		return Verdict{Next: &next, Quorum: quorum}, err
	}
	principal := schemas.Principal(d.Transport, d.Decider.ID)
	vote := schemas.DecisionInfo{DecisionID: d.DecisionID, Principal: principal, Option: d.Option, DecidedAt: now, Assurance: d.Decider.Assurance(), Note: d.Note}
	if want == schemas.ApprovalApproved && quorum > 1 {
		if slices.ContainsFunc(rec.Votes, func(v schemas.DecisionInfo) bool { return v.Principal == principal }) {
			return Verdict{Effect: Idempotent, Quorum: quorum}, nil
		}
		next.Votes = append(slices.Clip(rec.Votes), vote) // a new array: rec's is never written
		if len(next.Votes) < quorum {
			return Verdict{Effect: Vote, Next: &next, Quorum: quorum}, nil
		}
	}
	next.Status, next.Decision = want, &vote
	return Verdict{Effect: Applied, Next: &next, Quorum: quorum}, nil
}

// statusOf is the status option gives an approval: approve and grant
// options named "approve-*" approve, anything else denies.
func statusOf(option string) schemas.ApprovalStatus { return schemas.OptionEffect(option) }
