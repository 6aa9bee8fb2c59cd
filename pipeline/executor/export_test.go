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

// SetBeforeCreate makes f run between a new turn's session write and the
// creation of its batch already running (nil: nothing).
func SetBeforeCreate(x *Executor, f func(turn string) error) {
	if f == nil {
		x.beforeCreate.Store(nil)
		return
	}
	x.beforeCreate.Store(&f)
}
