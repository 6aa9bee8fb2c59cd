package approver

import "github.com/tollgate-dev/tollgate/schemas"

// Latest is the pending tracker's last watched revision of approval id
// (PendingTracker.Latest).
func Latest(a *Approver, id string) (*schemas.ApprovalRecord, uint64, bool) {
	return a.pending.Latest(id)
}

// SetLatest makes the pending tracker hold rec at rev as approval id's
// last watched revision, as a watch that lags behind the bucket would.
func SetLatest(a *Approver, id string, rec *schemas.ApprovalRecord, rev uint64) {
	a.pending.keep(id, rec, rev)
}
