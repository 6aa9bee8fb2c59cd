package redrive

// SetBeforeStart makes r call f between a batch's evaluation and its move
// to started (tests only).
func SetBeforeStart(r *Redriver, f func(turnID string)) { r.beforeStart.Store(&f) }
