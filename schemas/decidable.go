package schemas

import "time"

// Decidable is the one rule of whether a decision on approval a can still
// be taken at now, used by the approver and every surface that offers a
// decision (the chat transports' buttons): nil when a is pending and its
// expiry, if any, has not passed. Otherwise a *Error saying why not:
// CodeApprovalExpired when a is expired, or pending with ExpiresAt at or
// before now (the approver has not moved it yet); CodeApprovalAlreadyDecided
// for any other status.
func (a *ApprovalRecord) Decidable(now time.Time) error {
	switch {
	case a.Status == ApprovalExpired,
		a.Status == ApprovalPending && !a.ExpiresAt.IsZero() && !now.Before(a.ExpiresAt):
		return Errorf(CodeApprovalExpired, "approval %s expired at %s", a.ApprovalID, a.ExpiresAt.Format(time.RFC3339))
	case a.Status != ApprovalPending:
		return Errorf(CodeApprovalAlreadyDecided, "approval %s is already %s", a.ApprovalID, a.Status)
	}
	return nil
}

// Holds reports whether a holds decision id: as its decision, or as a
// counted quorum vote. It is the one rule of whether an answer about a is
// an answer to decision id (a surface that sent id waits for it; another
// decision winning the race is not its answer: the approver rejects id
// APPROVAL_ALREADY_DECIDED).
func (a *ApprovalRecord) Holds(id string) bool { return a.DecisionOf(id) != nil }

// DecisionOf is what a holds of decision id (see Holds): its decision, a
// counted quorum vote, or nil.
func (a *ApprovalRecord) DecisionOf(id string) *DecisionInfo {
	return taken(a.Decision, a.Votes, id)
}

// Names reports whether the decided event e answers decision id: e's
// decision is id, or id is one of the quorum votes e counted (see
// ApprovalRecord.Holds).
func (e *DecidedEvent) Names(id string) bool { return taken(e.Decision, e.Votes, id) != nil }

// Answers reports whether the decided event e is the approver's answer to
// decision d: e names d (Names), e is the announcement made again for d
// (Repeat: d repeated the recorded outcome, from whichever authorized
// decider), or e holds a decision or a counted vote of d's principal with
// d's option, so that d repeats it. A repeated outcome is an idempotent
// success (docs/security.md rule 5): the approver announces the approval
// again, and the event it announces names the first decision, not the
// repeat. Any other event is not d's
// answer, whatever its status: a decision of someone else may have won
// the race (the approver rejects d APPROVAL_ALREADY_DECIDED), or d may yet
// be refused (DECIDER_NOT_AUTHORIZED), and d's sender waits for the
// approver's word on d itself.
func (e *DecidedEvent) Answers(d *Decision) bool {
	if d == nil || e.ApprovalID != d.ApprovalID {
		return false
	}
	if e.Names(d.DecisionID) || (e.Repeat != "" && e.Repeat == d.DecisionID) {
		return true
	}
	principal := Principal(d.Transport, d.Decider.ID)
	same := func(x *DecisionInfo) bool { return x.Principal == principal && x.Option == d.Option }
	if e.Decision != nil && same(e.Decision) {
		return true
	}
	for i := range e.Votes {
		if same(&e.Votes[i]) {
			return true
		}
	}
	return false
}

func taken(d *DecisionInfo, votes []DecisionInfo, id string) *DecisionInfo {
	if id == "" {
		return nil
	}
	if d != nil && d.DecisionID == id {
		return d
	}
	for i := range votes {
		if votes[i].DecisionID == id {
			return &votes[i]
		}
	}
	return nil
}
