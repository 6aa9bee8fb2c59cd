package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Action is what a rebuild does, or would do, with one KV key.
type Action string

const (
	// Create: the key is missing; the record is created from the streams.
	Create Action = "create"
	// Update: KV holds an earlier stage of the record; it is moved to the
	// streams' by compare-and-set (what KV knows that the streams do not,
	// such as a result the streams lack, is kept).
	Update Action = "update"
	// Unchanged: KV is as far along as the streams, or further.
	Unchanged Action = "unchanged"
	// Kept: KV holds a record a rebuild does not judge (it does not
	// decode, or it is a version 1 approval): left alone.
	Kept Action = "kept"
	// Conflict: KV and the streams disagree on the record's authority
	// (TurnContext, calls, the call an approval binds) or on a final
	// state: left alone, for a person to look at.
	Conflict Action = "conflict"
)

// Change is the verdict on one KV key.
type Change struct {
	Key     string `json:"key"`
	Action  Action `json:"action"`
	KV      string `json:"kv"`      // state or status in KV before ("" if absent)
	Streams string `json:"streams"` // state or status according to the streams
	Reason  string `json:"reason,omitempty"`
}

// LogKept starts the Reason of the Change of a batch kept in its turn's
// log (a stream), which a run reads and never writes.
const LogKept = "kept in its turn's log"

// changes reports whether c writes (or would write) KV.
func (c Change) changes() bool { return c.Action == Create || c.Action == Update }

// applier compares a History with KV and, on Rebuild, writes.
type applier struct {
	js  jetstream.JetStream
	b   *buckets
	o   Options
	rep *Report
	run string // distinguishes this run's notice message ids

	active map[string]string // session key -> its active turn, as KV (or this run) has it

	// firstUnfinished is, by session key, the first turn in the streams'
	// order that the streams do not show ended; batchesCreated the
	// creation time of the batches bucket's stream (read once).
	firstUnfinished map[string]string
	batchesCreated  time.Time
}

// maxAttempts bounds how often a key is judged again after a concurrent
// writer changed it between the read and the write.
const maxAttempts = 10

func (a *applier) apply(ctx context.Context, h *History) error {
	a.firstUnfinished = map[string]string{}
	for _, t := range h.Turns {
		key := schemas.SessionKeyOf(t.Batch.Context)
		if _, ok := a.firstUnfinished[key]; !ok && !t.Batch.State.Terminal() && t.Batch.Origin == "" {
			a.firstUnfinished[key] = t.TurnID
		}
	}
	for _, t := range h.Turns {
		tr := TurnReport{TurnID: t.TurnID, SessionID: t.SessionID, Seq: t.Seq, Accepted: t.Accepted, State: t.Batch.State,
			Notes: t.Notes, recs: map[string]*schemas.ApprovalRecord{}}
		// Approvals first: a batch waiting on approvals that are not
		// there yet would fail closed if a redriver looked at it.
		for _, want := range t.Approvals {
			c, rec, err := converge(ctx, a, a.b.approvals, want.ApprovalID, want, judgeApproval)
			if err != nil {
				return err
			}
			a.count(c)
			tr.Approvals = append(tr.Approvals, c)
			tr.recs[want.ApprovalID] = rec
		}
		logged, err := a.fromLog(ctx, t, &tr)
		if err != nil {
			return err
		}
		if logged {
			// Only a version 1 batch (in the bucket) has claim records.
			a.count(tr.Batch)
			a.rep.Turns = append(a.rep.Turns, tr)
			continue
		}
		want, err := a.batchToWrite(ctx, t)
		if err != nil {
			return err
		}
		tr.Batch, tr.rec, err = converge(ctx, a, a.b.batches, t.TurnID, want, judgeBatch)
		if err != nil {
			return err
		}
		a.count(tr.Batch)
		if tr.rec == nil || tr.rec.Legacy() {
			// Only a version 1 batch's calls have claims in tollgate_claims.
			if err := a.checkClaims(ctx, t); err != nil {
				return err
			}
		}
		a.rep.Turns = append(a.rep.Turns, tr)
	}
	created, err := a.sessions(ctx)
	if err != nil {
		return err
	}
	if a.o.Rebuild {
		return a.nudge(ctx, created)
	}
	return nil
}

// fromLog judges t's batch by its turn's log, when the log has an event:
// the last event is the batch (store.BatchLog), kept in a stream that is
// the source of truth, so it is never rebuilt and never written by a run;
// the Change is Unchanged (Kept when the record does not decode) with the
// log's state, and tr's record is the log's, for the sessions, the nudges
// and the shadow redrive to judge. It reports false, leaving tr alone, when
// the log has no event (or its stream is missing): the batch is then an
// earlier version's in the bucket, or was never written, or was lost with
// the bucket, and converges there.
func (a *applier) fromLog(ctx context.Context, t *Turn, tr *TurnReport) (bool, error) {
	s := a.b.turnLog(t.TurnID)
	if s == nil {
		return false, nil
	}
	where := fmt.Sprintf("%s (stream %s), the source of truth: never rebuilt", LogKept, s.CachedInfo().Config.Name)
	rec, _, err := store.BatchLog{Log: a.b.turnLogs}.Get(ctx, t.TurnID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case schemas.CodeOf(err) != "":
		tr.Batch = Change{Key: t.TurnID, Action: Kept, KV: "undecodable", Streams: stageOf(t.Batch),
			Reason: fmt.Sprintf("%s; left alone (the stages fail closed on it): %v", where, err)}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("replay: read the log of %s: %w", t.TurnID, err)
	}
	tr.Batch = Change{Key: t.TurnID, Action: Unchanged, KV: string(rec.State), Streams: stageOf(t.Batch), Reason: where}
	tr.rec = rec
	return true, nil
}

// batchToWrite is t's batch as a rebuild would create it (when KV lacks
// it): the projection; or, when any of its calls has a claim record in
// tollgate_claims, the same as a version 1 record (the batch was written
// before claims moved into the record, and those claim records say which
// of its calls ran); or, for a batch the streams leave queued that may
// have been running its calls when its record was lost, the projection
// with every call without a result claimed (claimUnfinished).
//
// A queued batch may have been running its calls only if its record was
// lost (lostBatch) and it may have held its session: it is the first
// unfinished turn of its session in the streams (a session runs one turn
// at a time, in order, so a later one has run nothing), and its session
// record, where KV still has one, names it (or its agent loop) active. A
// step of an agent loop runs inside its loop's hold: only the session
// record can clear it.
func (a *applier) batchToWrite(ctx context.Context, t *Turn) (*schemas.BatchRecord, error) {
	b := t.Batch
	if b.Legacy() {
		return b, nil
	}
	if a.b.claims != nil {
		for _, c := range b.Calls {
			_, err := get(ctx, a.b.claims, c.CallID)
			switch {
			case err == nil:
				return schemas.AsLegacyBatch(b), nil
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return nil, fmt.Errorf("replay: read claim %s: %w", c.CallID, err)
			}
		}
	}
	if b.State != schemas.BatchQueued {
		return b, nil
	}
	lost, err := a.lostBatch(ctx, t)
	if err != nil || !lost {
		return b, err
	}
	key := schemas.SessionKeyOf(b.Context)
	if b.Origin == "" && a.firstUnfinished[key] != t.TurnID {
		return b, nil // queued behind an earlier unfinished turn
	}
	if a.b.sessions != nil {
		e, err := get(ctx, a.b.sessions, key)
		switch {
		case err == nil:
			if s, err := schemas.Decode[schemas.SessionRecord](e.Value()); err == nil && s.Active != b.TurnID && (b.Origin == "" || s.Active != b.Origin) {
				return b, nil // its session is held by another turn
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, fmt.Errorf("replay: read session of %s: %w", b.TurnID, err)
		}
	}
	c := schemas.AsCurrentBatch(b)
	c.Claims = nil
	claimUnfinished(c)
	return c, nil
}

// lostBatch reports whether t's batch record may have been lost, rather
// than never written; it is asked only of a turn whose log has no event.
// The record may have been lost when its key in the batches bucket has a
// delete or purge marker, or the batches bucket's stream or the turn's
// turn-log stream (its partition) is missing or was created after t was
// accepted (deleted and made again, or restored from a backup), or that
// partition has lost messages from its head since t was accepted (aged
// out: its max age is shorter than the streams that still hold t; or
// purged, headRemovedSince): the batch was kept in one of them. A key the bucket never had, with a bucket and a
// log older than the turn, was never written: the executor never took the
// turn.
func (a *applier) lostBatch(ctx context.Context, t *Turn) (bool, error) {
	if a.b.batches == nil {
		return true, nil
	}
	_, err := a.b.batches.Get(ctx, t.TurnID)
	switch {
	case errors.Is(err, jetstream.ErrKeyDeleted):
		return true, nil
	case err == nil:
		return false, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, fmt.Errorf("replay: read batch %s: %w", t.TurnID, err)
	}
	if s := a.b.turnLog(t.TurnID); s == nil || s.CachedInfo().Created.After(t.Accepted) || headRemovedSince(s.CachedInfo().State, t.Accepted) {
		return true, nil
	}
	if a.batchesCreated.IsZero() {
		s, err := a.js.Stream(ctx, "KV_"+a.b.batches.Bucket())
		if err != nil {
			return false, fmt.Errorf("replay: batches bucket: %w", err)
		}
		a.batchesCreated = s.CachedInfo().Created
	}
	return a.batchesCreated.After(t.Accepted), nil
}

// headRemovedSince reports whether a stream in state st has lost messages
// from its head (aged out, purged) that may have been stored at or after
// at: its first message is no longer its first ever, and is younger than
// at, or it holds none of the messages it stored. A turn's log that is
// empty for such a reason may have held the turn's batch (its claims, its
// outcome: the only record that the turn ended), so the batch is taken for
// lost, never for one that was not written.
func headRemovedSince(st jetstream.StreamState, at time.Time) bool {
	switch {
	case st.LastSeq == 0:
		return false // never written
	case st.Msgs == 0:
		return true
	}
	return st.FirstSeq > 1 && !st.FirstTime.Before(at)
}

// checkClaims warns about every call the turn's outcome says ran whose
// execution claim is missing: tollgate_claims has lost records (purged,
// restored from an old backup), and a redrive of a batch whose calls ran
// could run them again. Nothing a rebuild writes depends on it.
func (a *applier) checkClaims(ctx context.Context, t *Turn) error {
	if a.b.claims == nil || t.outcome == nil {
		return nil
	}
	for _, r := range t.outcome.Results {
		switch r.Status {
		case schemas.ResultOK, schemas.ResultError, schemas.ResultNeedsAttention:
		default:
			continue // did not run
		}
		if _, err := get(ctx, a.b.claims, r.CallID); errors.Is(err, jetstream.ErrKeyNotFound) {
			a.rep.Warnings = append(a.rep.Warnings, fmt.Sprintf("call %s ran (turn outcome: %s) but has no execution claim: %s has lost records; do not redrive its batches until it is restored", r.CallID, r.Status, topology.BucketClaims))
		} else if err != nil {
			return fmt.Errorf("replay: read claim %s: %w", r.CallID, err)
		}
	}
	return nil
}

func (a *applier) count(c Change) {
	switch {
	case c.changes():
		a.rep.Changes++
	case c.Action == Conflict:
		a.rep.Conflicts++
	}
}

// judgement is a judge's verdict on the bytes KV holds at a key.
type judgement[P any] struct {
	action Action
	kv     string // KV's state or status
	reason string
	next   P // the record to write (Update), or KV's own record (nil if it does not decode)
}

// converge brings key of kv towards want under the rebuild rule and
// returns the verdict and the record the key holds afterwards (or would,
// without Rebuild): want, KV's own, or a merge. Creates are create-only
// and updates compare-and-set on the revision judged; if another writer
// got there first the key is judged again.
func converge[T any, P schemas.Ptr[T]](ctx context.Context, a *applier, kv jetstream.KeyValue, key string, want P,
	judge func(raw []byte, want P) judgement[P]) (Change, P, error) {
	b := store.Bucket[T, P]{KV: kv}
	for range maxAttempts {
		e, err := get(ctx, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			c := Change{Key: key, Action: Create, Streams: stageOf(want)}
			if !a.o.Rebuild {
				return c, want, nil
			}
			if _, err := b.Create(ctx, key, want); errors.Is(err, store.ErrExists) {
				continue // written meanwhile: judge what is there now
			} else if err != nil {
				return c, nil, fmt.Errorf("replay: %w", err)
			}
			return c, want, nil
		}
		if err != nil {
			return Change{}, nil, fmt.Errorf("replay: read %s/%s: %w", kv.Bucket(), key, err)
		}
		j := judge(e.Value(), want)
		c := Change{Key: key, Action: j.action, KV: j.kv, Streams: stageOf(want), Reason: j.reason}
		if j.action != Update || !a.o.Rebuild {
			return c, j.next, nil
		}
		if _, err := b.Update(ctx, key, j.next, e.Revision()); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return c, nil, fmt.Errorf("replay: %w", err)
		}
		return c, j.next, nil
	}
	return Change{}, nil, fmt.Errorf("replay: %s/%s kept changing under the rebuild (%d attempts)", kv.Bucket(), key, maxAttempts)
}

// stageOf is a record's state (batch) or status (approval).
func stageOf(r any) string {
	switch r := r.(type) {
	case *schemas.BatchRecord:
		return string(r.State)
	case *schemas.ApprovalRecord:
		return string(r.Status)
	}
	return ""
}

// batchRank orders batch states along the lifecycle.
func batchRank(s schemas.BatchState) int {
	switch s {
	case schemas.BatchQueued:
		return 0
	case schemas.BatchRunning:
		return 1
	case schemas.BatchAwaiting:
		return 2
	case schemas.BatchStarted:
		return 3
	}
	return 4 // completed or failed (a decoded record has a valid state)
}

func judgeBatch(raw []byte, want *schemas.BatchRecord) judgement[*schemas.BatchRecord] {
	have, err := schemas.DecodeBatch(raw)
	if err != nil {
		return judgement[*schemas.BatchRecord]{action: Kept, kv: "undecodable", reason: fmt.Sprintf("left alone (the stages fail closed on it): %v", err)}
	}
	j := judgement[*schemas.BatchRecord]{action: Unchanged, kv: string(have.State), next: have}
	switch hr, wr := batchRank(have.State), batchRank(want.State); {
	case schemas.ContextDigest(have.Context) != schemas.ContextDigest(want.Context) || !slices.Equal(have.Calls, want.Calls) ||
		have.Text != want.Text || have.Origin != want.Origin:
		j.action, j.reason = Conflict, "KV's batch carries another TurnContext or other calls than the accepted turn"
	case have.State.Terminal() && want.State.Terminal() && have.State != want.State:
		j.action, j.reason = Conflict, "KV and the turn outcome disagree on how the turn ended"
	case hr > wr:
		j.reason = "KV is further along than the streams"
	case hr < wr:
		j.action, j.next = Update, mergeBatch(have, want)
	}
	return j
}

// mergeBatch is want, keeping what have (an earlier stage of the same
// batch in KV) knows that the streams do not: approvals and results the
// events lack, and the executor's own creation time.
func mergeBatch(have, want *schemas.BatchRecord) *schemas.BatchRecord {
	next := *want
	next.Approvals, next.Results = slices.Clone(want.Approvals), slices.Clone(want.Results)
	for i := range next.Calls {
		if next.Approvals[i] == "" && i < len(have.Approvals) {
			next.Approvals[i] = have.Approvals[i]
		}
		if next.Results[i] == nil && i < len(have.Results) {
			next.Results[i] = have.Results[i]
		}
	}
	next.CreatedAt = have.CreatedAt
	// The claims are KV's: the record itself holds a version 2 batch's
	// (the streams do not), and a version 1 batch's are in
	// tollgate_claims, so it stays version 1.
	next.Claims = slices.Clone(have.Claims)
	if have.Legacy() {
		return schemas.AsLegacyBatch(&next)
	}
	return schemas.AsCurrentBatch(&next)
}

func judgeApproval(raw []byte, want *schemas.ApprovalRecord) judgement[*schemas.ApprovalRecord] {
	have, v1, err := schemas.DecodeApproval(raw)
	switch {
	case err != nil:
		return judgement[*schemas.ApprovalRecord]{action: Kept, kv: "undecodable", reason: fmt.Sprintf("left alone (the stages fail closed on it): %v", err)}
	case v1 != nil:
		return judgement[*schemas.ApprovalRecord]{action: Kept, kv: string(v1.Status), reason: "a version 1 record: left to the compatibility path"}
	}
	j := judgement[*schemas.ApprovalRecord]{action: Unchanged, kv: string(have.Status), next: have}
	switch {
	case have.TurnID != want.TurnID || have.CallID != want.CallID || have.Tool != want.Tool || have.ArgsDigest != want.ArgsDigest ||
		schemas.ContextDigest(have.Context) != schemas.ContextDigest(want.Context):
		j.action, j.reason = Conflict, "KV's approval binds another call or TurnContext than the approval-requested event"
	case have.Status.Decided() && want.Status.Decided() && have.Status != want.Status:
		j.action, j.reason = Conflict, "KV and the decided event disagree on the decision"
	case have.Status.Decided() && !want.Status.Decided():
		j.reason = "KV is further along than the streams"
	case !have.Status.Decided() && want.Status.Decided():
		j.action, j.next = Update, want
	}
	return j
}

// sessions considers every session with an unfinished turn without a
// place in its session's order (an earlier version's) in the report:
// a missing session record is created (create-only) with the first such
// turn active and the others queued in accepted order, as the executor
// would have left it. It returns the sessions it created (or would).
func (a *applier) sessions(ctx context.Context) (map[string]bool, error) {
	var order []string
	turns := map[string][]string{}
	ids := map[string]string{} // session key -> session id
	for _, tr := range a.rep.Turns {
		if tr.rec == nil || tr.rec.State.Terminal() || tr.SessionID == "" || tr.rec.OrderSeq != 0 {
			// A batch with a place waits in its session's order
			// (TOLLGATE_TURNS), which no bucket loss touches: no
			// session record is rebuilt for it.
			continue
		}
		// Grouped by session key (the turn's sealed context): two
		// transports' sessions with one id are two sessions.
		key := schemas.SessionKeyOf(tr.rec.Context)
		if turns[key] == nil {
			order = append(order, key)
			ids[key] = tr.SessionID
		}
		turns[key] = append(turns[key], tr.TurnID)
	}
	a.active = map[string]string{}
	created := map[string]bool{}
	for _, key := range order {
		want := &schemas.SessionRecord{V: schemas.SessionVersion, SessionID: ids[key], Active: turns[key][0], Queue: turns[key][1:], UpdatedAt: a.o.Now().UTC()}
		c, rec, err := converge(ctx, a, a.b.sessions, key, want, judgeSession)
		if err != nil {
			return nil, err
		}
		c.Streams = "active " + want.Active
		a.count(c)
		a.rep.Sessions = append(a.rep.Sessions, c)
		if rec != nil {
			a.active[key] = rec.Active
		}
		created[key] = c.Action == Create
	}
	return created, nil
}

func judgeSession(raw []byte, _ *schemas.SessionRecord) judgement[*schemas.SessionRecord] {
	have, err := schemas.Decode[schemas.SessionRecord](raw)
	if err != nil {
		return judgement[*schemas.SessionRecord]{action: Kept, kv: "undecodable", reason: fmt.Sprintf("left alone: %v", err)}
	}
	return judgement[*schemas.SessionRecord]{action: Unchanged, kv: "active " + have.Active, next: have,
		reason: "an existing session record is never rewritten: the stages keep it"}
}

// nudge publishes, for each turn whose records this rebuild wrote (or
// whose session it created), the notice its stages act on, so the turn is
// picked up without waiting for an event that may have been consumed
// while its records were missing: a batch-awaiting notice to the redriver
// for an awaiting, started or finished batch (it re-evaluates the barrier,
// resumes a started batch, or finishes a terminal one and frees its
// session), a ready notice to the executor for a queued batch that holds
// its session. Both are control messages without authority; the stages
// read the records from KV and are idempotent. A rebuild that wrote
// nothing publishes nothing.
func (a *applier) nudge(ctx context.Context, sessionCreated map[string]bool) error {
	for i := range a.rep.Turns {
		tr := &a.rep.Turns[i]
		if tr.rec == nil {
			continue
		}
		key := schemas.SessionKeyOf(tr.rec.Context)
		wrote := tr.Batch.changes() || slices.ContainsFunc(tr.Approvals, Change.changes) || sessionCreated[key]
		if !wrote {
			continue
		}
		n := &schemas.TurnNotice{TurnID: tr.TurnID, SessionID: tr.SessionID, Kind: schemas.NoticeAwaiting, At: a.o.Now().UTC()}
		subject := topology.EventSubject(topology.SubjectBatchAwaiting, tr.TurnID)
		switch tr.rec.State {
		case schemas.BatchRunning:
			continue // the executor working on it finishes it
		case schemas.BatchQueued:
			if tr.rec.OrderSeq != 0 {
				// Its stage starts it if its turn has come
				// (batch.Engine.ItsTurn), and leaves it queued otherwise.
				n.Kind, subject = schemas.NoticeReady, topology.ReadySubject(key)
				break
			}
			if a.active[key] != tr.TurnID {
				continue // the turn before it hands the session on when it ends
			}
			n.Kind, subject = schemas.NoticeReady, topology.ReadySubject(key)
		}
		if err := bus.Publish(ctx, a.js, subject, topology.ReplayNoticeMsgID(a.run, tr.TurnID), n); err != nil {
			return fmt.Errorf("replay: nudge %s: %w", tr.TurnID, err)
		}
		tr.Notice = subject
		a.rep.Notices++
	}
	return nil
}
