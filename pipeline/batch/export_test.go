package batch

import "context"

// SetBeforeQueue makes Acquire call f after it read the session and its
// holder and before the write that queues turn behind the holder.
func (e *Engine) SetBeforeQueue(f func(turn string)) { e.beforeQueue.Store(&f) }

// MarkStarted records that e starts call id's tool now (as a run does).
func (e *Engine) MarkStarted(id string) { e.markStarted(id) }

// Started returns how many calls e remembers starting.
func (e *Engine) Started() int {
	n := 0
	e.started.Range(func(any, any) bool { n++; return true })
	return n
}

// PruneEvery is how many starts pass between two sweeps of the calls an
// engine remembers starting.
const PruneEvery = pruneEvery

// AcquireIfFree takes a free session for a turn with no batch record, as
// earlier versions' executors did (acquireIfFree).
func (e *Engine) AcquireIfFree(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	return e.acquireIfFree(ctx, sess, turnID, inboundSeq, snap)
}

// RecordsCurrent reports whether e's view of the session records is
// current (records.go).
func (e *Engine) RecordsCurrent() bool { return e.records.current() == 1 }

// RecordKnown reports whether e's view holds a record of session key.
func (e *Engine) RecordKnown(key string) bool {
	x := e.records.index()
	return x != nil && x.Has(key)
}
