package executor

// SetBeforeAnnounce makes f run between a batch's awaiting write and the
// announcements of its approvals (nil: nothing).
func SetBeforeAnnounce(x *Executor, f func(turn string) error) {
	if f == nil {
		x.beforeAnnounce.Store(nil)
		return
	}
	x.beforeAnnounce.Store(&f)
}
