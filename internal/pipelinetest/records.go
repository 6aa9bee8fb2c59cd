// The KV records: read a batch, approval or session, wait until one
// reaches a state, and edit one behind the pipeline's back.

package pipelinetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
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

// MakeLegacy rewrites the batch record of turnID as the previous version
// wrote it (version 1, no claims in it: schemas.BatchRecordV1), so that a
// test can leave in tollgate_claims the claims that version made.
func (h *H) MakeLegacy(turnID string) {
	h.T.Helper()
	h.MutateBatch(turnID, func(b *schemas.BatchRecord) { *b = *schemas.AsLegacyBatch(b) })
	if !h.Batch(turnID).Legacy() {
		h.T.Fatalf("pipelinetest: batch %s was not written as version 1", turnID)
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
	return getOrNil(h, h.Store.Batches, turnID)
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

// getOrNil reads key from b: nil if absent, a test failure on any other error.
func getOrNil[T any, P schemas.Ptr[T]](h *H, b store.Bucket[T, P], key string) *T {
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

// PutRaw writes raw bytes at key in kv, bypassing encoding (tampering).
func (h *H) PutRaw(kv jetstream.KeyValue, key string, data []byte) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := kv.Put(ctx, key, data); err != nil {
		h.T.Fatalf("pipelinetest: put %s/%s: %v", kv.Bucket(), key, err)
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
