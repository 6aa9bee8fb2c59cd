// The records: read a batch (from its turn log, or the batches bucket),
// an approval or a session, wait until one reaches a state, and edit one
// behind the pipeline's back.

package pipelinetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// MutateBatch edits the batch record of turnID in KV behind the pipeline's
// back (compare-and-set), as an attacker or a stray operator edit would.
func (h *H) MutateBatch(turnID string, fn func(*schemas.BatchRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Batches.Mutate(ctx, turnID, func(b *schemas.BatchRecord) error { fn(b); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: tamper batch %s: %v", turnID, err)
	}
}

// MakeLegacy moves the batch record of turnID where the version before
// the claims in the batch record kept it, as that version wrote it: into
// tollgate_batches, as version 1 (no claims in it: schemas.BatchRecordV1),
// so that a test can leave in tollgate_claims the claims that version made.
func (h *H) MakeLegacy(turnID string) {
	h.T.Helper()
	h.moveToBucket(turnID, schemas.AsLegacyBatch)
	if b := h.Batch(turnID); !b.Legacy() || !b.Bucketed() {
		h.T.Fatalf("pipelinetest: batch %s was not moved to the bucket as version 1", turnID)
	}
}

// MakeBucketed moves the batch record of turnID where the version before
// the turn logs kept it: into tollgate_batches, as version 2, with its
// claims.
func (h *H) MakeBucketed(turnID string) {
	h.T.Helper()
	h.moveToBucket(turnID, schemas.AsBucketedBatch)
	if b := h.Batch(turnID); b.Legacy() || !b.Bucketed() {
		h.T.Fatalf("pipelinetest: batch %s was not moved to the bucket as version 2", turnID)
	}
}

// moveToBucket creates the batch of turnID, as as makes it, in
// tollgate_batches, purges the turn's log and publishes what an earlier
// version published for the batch's state (its requests, the outcome of
// an ended one, the awaiting and started notices):
// the turn is left as an earlier version left it. Nothing may be moving
// the batch meanwhile.
func (h *H) moveToBucket(turnID string, as func(*schemas.BatchRecord) *schemas.BatchRecord) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	b, _, err := h.Store.Batches.Log.Get(ctx, turnID)
	if err != nil {
		h.T.Fatalf("pipelinetest: read the batch of %s from its log: %v", turnID, err)
	}
	if _, err := h.Store.Batches.Bucket.Create(ctx, turnID, as(b)); err != nil {
		h.T.Fatalf("pipelinetest: write the batch of %s to the bucket: %v", turnID, err)
	}
	requested := h.LoggedRequests(turnID)
	if err := h.Store.Batches.Log.Log.Purge(ctx, turnID); err != nil {
		h.T.Fatalf("pipelinetest: purge the log of %s: %v", turnID, err)
	}
	// The events an earlier version published as the batch went through
	// the states it is past, which this version's stages no longer
	// publish: the approvals requested, the turn's outcome, the awaiting
	// notice (the approvals, and the results of the calls that needed
	// none), and the redrive started.
	for _, a := range requested {
		h.Publish(topology.EventSubject(topology.SubjectApprovalRequested, turnID), topology.RequestedMsgID(a.ApprovalID), a)
	}
	if b.Outcome != nil {
		h.Publish(topology.EventSubject(topology.SubjectTurnOutcome, turnID), topology.OutcomeMsgID(turnID), b.Outcome)
	}
	waited := slices.ContainsFunc(b.Approvals, func(id string) bool { return id != "" })
	if !waited || b.State == schemas.BatchQueued || b.State == schemas.BatchRunning {
		return
	}
	results := make([]*schemas.ToolResult, len(b.Results))
	for i, r := range b.Results {
		if i < len(b.Approvals) && b.Approvals[i] == "" {
			results[i] = r
		}
	}
	h.Publish(topology.EventSubject(topology.SubjectBatchAwaiting, turnID), topology.AwaitingMsgID(turnID),
		&schemas.TurnNotice{TurnID: turnID, SessionID: b.SessionID, Kind: schemas.NoticeAwaiting, At: b.UpdatedAt, Approvals: b.Approvals, Results: results})
	if b.State == schemas.BatchStarted || b.State == schemas.BatchCompleted {
		h.Publish(topology.EventSubject(topology.SubjectRedrive+string(schemas.RedriveStarted)+".", turnID), topology.RedriveMsgID(schemas.RedriveStarted, turnID),
			&schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveStarted, Trigger: "earlier version", At: b.UpdatedAt})
	}
}

// MutateApproval edits approval record id in KV like MutateBatch.
func (h *H) MutateApproval(id string, fn func(*schemas.ApprovalRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Approvals.Mutate(ctx, id, func(a *schemas.ApprovalRecord) error { fn(a); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: tamper approval %s: %v", id, err)
	}
}

// MutateApprovalUnheard edits approval record id like MutateApproval,
// but writes it marked as a rewrite (store.RewriteHeader), which no
// reader of the approvals bucket's stream takes for a decision
// (store.DecidedOf): a decision whose trigger never reached the redriver,
// for the recovery sweep to find.
func (h *H) MutateApprovalUnheard(id string, fn func(*schemas.ApprovalRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	rec, rev, err := h.Store.Approvals.Get(ctx, id)
	if err != nil {
		h.T.Fatalf("pipelinetest: read approval %s: %v", id, err)
	}
	fn(rec)
	data, err := schemas.Encode(rec)
	if err != nil {
		h.T.Fatalf("pipelinetest: encode approval %s: %v", id, err)
	}
	hdr := nats.Header{}
	hdr.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	hdr.Set(store.RewriteHeader, store.RewriteRetire)
	h.PublishRaw(topology.ApprovalRevisionSubject(id), "", data, hdr)
}

// MutateSession edits the session record of sessionID of transport "cli"
// (Inbound's) in KV like MutateBatch (e.g. to play a worker that died
// between two steps).
func (h *H) MutateSession(sessionID string, fn func(*schemas.SessionRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Sessions.Mutate(ctx, schemas.SessionKey("cli", sessionID), func(s *schemas.SessionRecord) error { fn(s); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: edit session %s: %v", sessionID, err)
	}
}

// Batch returns the batch record of turnID, or nil if there is none.
func (h *H) Batch(turnID string) *schemas.BatchRecord {
	h.T.Helper()
	return getOrNil[schemas.BatchRecord](h, h.Store.Batches, turnID)
}

// Approval returns the approval record id, or nil if there is none.
func (h *H) Approval(id string) *schemas.ApprovalRecord {
	h.T.Helper()
	return getOrNil(h, h.Store.Approvals, id)
}

// Session returns the session record of sessionID of transport "cli"
// (Inbound's), or nil.
func (h *H) Session(sessionID string) *schemas.SessionRecord {
	h.T.Helper()
	return h.SessionOn("cli", sessionID)
}

// SessionOn returns the session record of sessionID of transport, or nil.
func (h *H) SessionOn(transport, sessionID string) *schemas.SessionRecord {
	h.T.Helper()
	return getOrNil(h, h.Store.Sessions, schemas.SessionKey(transport, sessionID))
}

// SessionFree reports whether the cli session sessionID is free: every
// turn of its order (Order) has ended, and its session record (which only
// an earlier version's turns, and a first entry queued behind one, write)
// is absent, or has no turn queued and either none active or an active
// turn whose batch has ended (a turn's end writes nothing when none is
// queued behind it).
func (h *H) SessionFree(sessionID string) bool {
	h.T.Helper()
	return h.SessionFreeAt(schemas.SessionKey("cli", sessionID))
}

// SessionFreeAt is SessionFree for the session with key key.
func (h *H) SessionFreeAt(key string) bool {
	h.T.Helper()
	for _, turn := range h.OrderAt(key) {
		if b := h.Batch(turn); b == nil || !b.State.Terminal() {
			return false
		}
	}
	s := getOrNil(h, h.Store.Sessions, key)
	if s == nil {
		return true
	}
	if len(s.Queue) > 0 {
		return false
	}
	if s.Active == "" {
		return true
	}
	b := h.Batch(s.Active)
	return b != nil && b.State.Terminal()
}

// RecordSessions writes the session records an earlier version kept for
// turns, taken in the order given: per session, the first turn whose batch
// has not ended holds it (active) and the later ones not ended are queued
// behind it. This version writes no session record for a turn with a
// place in its session's order; a test that makes batches an earlier
// version's (MakeBucketed, MakeLegacy) writes what that version wrote
// with them. A session whose turns have all ended gets no record.
func (h *H) RecordSessions(turns ...string) {
	h.T.Helper()
	recs := map[string]*schemas.SessionRecord{}
	var keys []string
	for _, turn := range turns {
		b := h.Batch(turn)
		if b == nil || b.State.Terminal() {
			continue
		}
		key := schemas.SessionKeyOf(b.Context)
		r := recs[key]
		if r == nil {
			r = &schemas.SessionRecord{SessionID: b.SessionID, Active: turn, UpdatedAt: time.Now().UTC()}
			recs[key], keys = r, append(keys, key)
			continue
		}
		r.Queue = append(r.Queue, turn)
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	for _, key := range keys {
		if _, err := h.Store.Sessions.Create(ctx, key, recs[key]); err != nil {
			h.T.Fatalf("pipelinetest: session record %s: %v", key, err)
		}
	}
}

// Order returns the turns of the cli session sessionID's order, one per
// entry that places its turn, in order (docs/protocol.md §5.4): repeated
// entries, and later entries of a turn already in it, are left out.
func (h *H) Order(sessionID string) []string {
	h.T.Helper()
	return h.OrderAt(schemas.SessionKey("cli", sessionID))
}

// OrderAt is Order for the session with key key.
func (h *H) OrderAt(key string) []string {
	h.T.Helper()
	var turns []string
	for _, m := range h.Messages(topology.StreamTurns, topology.OrderWildcard(key)) {
		e, err := turnorder.Stamp(m.Subject, m.Header)
		if err != nil {
			h.T.Fatalf("pipelinetest: entry %d of session %s: %v", m.Seq, key, err)
		}
		if !e.Repeated() && !slices.Contains(turns, e.Turn) {
			turns = append(turns, e.Turn)
		}
	}
	return turns
}

// getOrNil reads key from b: nil if absent, a test failure on any other error.
func getOrNil[T any](h *H, b interface {
	Get(context.Context, string) (*T, uint64, error)
}, key string) *T {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	v, _, err := b.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		h.T.Fatalf("pipelinetest: %v", err)
	}
	return v
}

// WaitBatch polls the batch of turnID until cond holds and returns it.
func (h *H) WaitBatch(turnID, what string, cond func(*schemas.BatchRecord) bool) *schemas.BatchRecord {
	h.T.Helper()
	var b *schemas.BatchRecord
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("batch %s: %s", turnID, what), func() bool {
		b = h.Batch(turnID)
		return b != nil && cond(b)
	})
	return b
}

// WaitState waits for the batch of turnID to be in state s.
func (h *H) WaitState(turnID string, s schemas.BatchState) *schemas.BatchRecord {
	h.T.Helper()
	return h.WaitBatch(turnID, "state "+string(s), func(b *schemas.BatchRecord) bool { return b.State == s })
}

// WaitTerminal waits until the batch of turnID is terminal and its outcome
// event is stored, and returns the batch and the (single) outcome.
func (h *H) WaitTerminal(turnID string) (*schemas.BatchRecord, *schemas.TurnOutcome) {
	h.T.Helper()
	b := h.WaitBatch(turnID, "terminal", func(b *schemas.BatchRecord) bool { return b.State.Terminal() })
	o := h.WaitOutcome(turnID)
	return b, o
}

// WaitApproval polls approval id until cond holds.
func (h *H) WaitApproval(id, what string, cond func(*schemas.ApprovalRecord) bool) *schemas.ApprovalRecord {
	h.T.Helper()
	var a *schemas.ApprovalRecord
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("approval %s: %s", id, what), func() bool {
		a = h.Approval(id)
		return a != nil && cond(a)
	})
	return a
}

// WaitPending waits for approval id to exist in status pending and for the
// batch of its turn to be awaiting.
func (h *H) WaitPending(id string) *schemas.ApprovalRecord {
	h.T.Helper()
	a := h.WaitApproval(id, "pending", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalPending })
	h.WaitState(a.TurnID, schemas.BatchAwaiting)
	return a
}

// WaitGrant waits until standing grant id is saved: its record stored
// and listed by its (tool, requester) index, which grants.Save writes
// after the record and through which a later call finds it (a turn sent
// between the two asks for approval), and returns the record.
func (h *H) WaitGrant(id string) *schemas.Grant {
	h.T.Helper()
	var g *schemas.Grant
	jstest.EventuallyState(h.T, h.wait, "grant "+id+" stored and indexed", func() (bool, string) {
		ctx, cancel := h.Ctx()
		defer cancel()
		var err error
		if g, _, err = h.Store.Grants.Get(ctx, id); err != nil {
			return false, "record: " + err.Error()
		}
		x, _, err := h.Store.GrantIndexes.Get(ctx, schemas.GrantIndexKey(g.Tool, g.Context.Requester.Principal))
		switch {
		case err != nil:
			return false, "index: " + err.Error()
		case !slices.Contains(x.Grants, id):
			return false, fmt.Sprintf("index lists %v", x.Grants)
		}
		return true, ""
	})
	return g
}

// PutRaw writes raw bytes at key in kv, bypassing encoding (tampering).
func (h *H) PutRaw(kv jetstream.KeyValue, key string, data []byte) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := kv.Put(ctx, key, data); err != nil {
		h.T.Fatalf("pipelinetest: put %s/%s: %v", kv.Bucket(), key, err)
	}
}

// PutRawBatch stores data as the batch record of turnID where its batch
// is kept, behind the pipeline's back (a tampered or corrupted record):
// the bucket's key for a batch an earlier version left there, else an
// event appended to the turn's log after its last one.
func (h *H) PutRawBatch(turnID string, data []byte) {
	h.T.Helper()
	if b := h.Batch(turnID); b != nil && b.Bucketed() {
		h.PutRaw(h.Store.Batches.KV, turnID, data)
		return
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	var after uint64
	switch last, err := h.Store.Batches.Log.Log.Last(ctx, turnID); {
	case err == nil:
		after = last.Seq
	case !errors.Is(err, turnlog.ErrNoEvents):
		h.T.Fatalf("pipelinetest: read the log of %s: %v", turnID, err)
	}
	if _, err := h.Store.Batches.Log.Log.Append(ctx, turnlog.Append{Turn: turnID, Event: "tampered", After: after, MsgID: h.NextID("tampered"), Data: data}); err != nil {
		h.T.Fatalf("pipelinetest: append to the log of %s: %v", turnID, err)
	}
}

// ForgeLostWrite sends to approval rec's subject the write of a
// compare-and-set that lost: rec with status and decision, expecting a
// revision that is not the record's last. The bucket refuses it (checked),
// and the record stays as it was; a core subscriber of the subject hears
// it (docs/protocol.md §4.2b: a heard revision is a wake-up only).
func (h *H) ForgeLostWrite(rec *schemas.ApprovalRecord, status schemas.ApprovalStatus, decision *schemas.DecisionInfo) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	_, rev, err := h.Store.Approvals.Get(ctx, rec.ApprovalID)
	if err != nil {
		h.T.Fatal(err)
	}
	lost := *rec
	lost.Status, lost.Decision = status, decision
	data, err := schemas.Encode(&lost)
	if err != nil {
		h.T.Fatal(err)
	}
	m := nats.NewMsg(topology.ApprovalRevisionSubject(rec.ApprovalID))
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev-1, 10))
	if _, err := h.JS.PublishMsg(ctx, m); err == nil {
		h.T.Fatal("pipelinetest: the bucket stored a write expecting a revision not its last")
	}
	if now := h.Approval(rec.ApprovalID); now.Status != schemas.ApprovalPending {
		h.T.Fatalf("pipelinetest: approval %s after the lost write, want pending", now.Status)
	}
}

// PutApproval creates approval record rec in KV as it is (no turn need
// be behind it), as the approver's or the executor's write would leave it.
func (h *H) PutApproval(rec *schemas.ApprovalRecord) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := h.Store.Approvals.Create(ctx, rec.ApprovalID, rec); err != nil {
		h.T.Fatalf("pipelinetest: put approval %s: %v", rec.ApprovalID, err)
	}
}

// SeedApproval writes a pending approval into KV as the executor writes
// one (a sealed TurnContext, one Create), without a turn behind it: for
// tests of what lists and reads approvals. Its turn is a fresh id, its
// requester <transport>:<sender> in session, its tool and arguments
// tool and args, requested at at, expiring a day later.
func (h *H) SeedApproval(transport, session, sender, tool, args string, at time.Time) *schemas.ApprovalRecord {
	h.T.Helper()
	turn := h.NextID("t-seed")
	canon, digest, err := schemas.CanonicalArgs(args)
	if err != nil {
		h.T.Fatal(err)
	}
	tc := &schemas.TurnContext{
		V: schemas.TurnContextVersion, SessionID: session, SessionKey: schemas.SessionKey(transport, session), TurnID: turn,
		Requester: schemas.Requester{Principal: schemas.Principal(transport, sender), SenderID: sender, Kind: schemas.SenderUser, Verified: true},
		Transport: transport, Channel: schemas.Channel{ID: "room", Kind: schemas.ChannelPrivate},
		Audience: schemas.AudienceTeam, TrustBoundary: "local", Interactive: true, CreatedAt: at.UTC(),
	}
	if err := h.Keys.Seal(tc); err != nil {
		h.T.Fatal(err)
	}
	rec := &schemas.ApprovalRecord{
		V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: session, CallID: "c-0",
		Context: tc, Tool: tool, Args: canon, ArgsDigest: digest, PolicyVersion: h.Policy.Version(), Options: h.Policy.Options(tool),
		Quorum: 1, Status: schemas.ApprovalPending, RequestedAt: at.UTC(), ExpiresAt: at.UTC().Add(24 * time.Hour),
	}
	if _, err := h.Store.Approvals.Create(context.Background(), rec.ApprovalID, rec); err != nil {
		h.T.Fatal(err)
	}
	return rec
}

// EndInLog writes the batch of o's turn into its turn log and ends it
// with o, as the stage that ends a batch does (the log's outcome event,
// whose record carries the outcome), and publishes nothing: for tests of
// readers of outcomes. The batch has no calls; it is created running.
func (h *H) EndInLog(o *schemas.TurnOutcome) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	now := o.FinishedAt
	if now.IsZero() {
		now = time.Now().UTC()
	}
	b := &schemas.BatchRecord{TurnID: o.TurnID, SessionID: o.SessionID, State: schemas.BatchRunning,
		Calls: []schemas.ToolCall{}, Approvals: []string{}, Results: []*schemas.ToolResult{}, CreatedAt: now, UpdatedAt: now}
	rev, err := h.Store.Batches.Log.Create(ctx, o.TurnID, b)
	if err != nil {
		h.T.Fatalf("pipelinetest: create the batch of %s in its log: %v", o.TurnID, err)
	}
	b.State = schemas.BatchCompleted
	if o.State == schemas.TurnFailed {
		b.State = schemas.BatchFailed
	}
	b.Outcome = o
	if _, err := h.Store.Batches.Log.Update(ctx, o.TurnID, b, rev); err != nil {
		h.T.Fatalf("pipelinetest: end the batch of %s in its log: %v", o.TurnID, err)
	}
}

// RunApprover runs an approver stage of its own on h's store, policy and
// keys (for a harness started without one, so that it starts after a test
// has set something up), until the test ends.
func (h *H) RunApprover() {
	h.T.Helper()
	h.RunApproverOn(h.Store)
}

// RunApproverOn is RunApprover on st instead of h's store (a copy of it
// whose buckets a test instruments, say), and returns the approver.
func (h *H) RunApproverOn(st *store.Store) *approver.Approver {
	h.T.Helper()
	return h.RunApproverWith(func(c *approver.Config) { c.Store = st })
}

// RunApproverWith is RunApprover with its configuration changed by set
// first (its NotFoundGrace, say), and returns the approver.
func (h *H) RunApproverWith(set func(*approver.Config)) *approver.Approver {
	h.T.Helper()
	cfg := approver.Config{
		JS: h.JS, Store: h.Store, Policy: h.Policy, Keys: h.Keys,
		Logger: Logger(), Metrics: runner.NewMetrics(nil),
	}
	set(&cfg)
	a, err := approver.New(cfg)
	if err != nil {
		h.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	h.T.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			h.T.Errorf("pipelinetest: approver: %v", err)
		}
	})
	return a
}
