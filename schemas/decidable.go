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
