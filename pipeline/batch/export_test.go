package batch

// SetBeforeQueue makes Acquire call f after it read the session and its
// holder and before the write that queues turn behind the holder.
func (e *Engine) SetBeforeQueue(f func(turn string)) { e.beforeQueue.Store(&f) }
