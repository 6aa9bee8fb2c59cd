package approver

// Latest is the pending tracker's last watched revision of approval id
// (PendingTracker.Latest).
func Latest(a *Approver, id string) ([]byte, uint64, bool) { return a.pending.Latest(id) }

// SetLatest makes the pending tracker hold data at rev as approval id's
// last watched revision, as a watch that lags behind the bucket would.
func SetLatest(a *Approver, id string, data []byte, rev uint64) { a.pending.keep(id, true, data, rev) }
