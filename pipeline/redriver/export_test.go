package redriver

// SetBeforeStart makes r call f between a batch's evaluation and its move
// to started (tests only).
func SetBeforeStart(r *Redriver, f func(turnID string)) { r.beforeStart.Store(&f) }

// SetSweepMaxLooks caps the batches one sweep pass looks at (tests only).
func SetSweepMaxLooks(r *Redriver, n int) { r.sweep.maxLooks.Store(int64(n)) }

// SweepMostLooks is the most batches one sweep pass has looked at.
func SweepMostLooks(r *Redriver) int64 { return r.sweep.mostLooks.Load() }
