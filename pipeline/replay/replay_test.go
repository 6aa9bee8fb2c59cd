package replay_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// testPolicy: echo runs at once, forbidden is denied, count and risky need
// the requester's approval, quorum needs two of bob, carol and dave.
const testPolicy = `{
  "version": "replay-test-1",
  "default_approval": "required",
  "tools": {
    "echo":      {"approval": "never"},
    "free":      {"approval": "never"},
    "forbidden": {"approval": "deny"},
    "count":     {"approval": "required"},
    "risky":     {"approval": "required"},
    "quorum":    {"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob", "cli:carol", "cli:dave"], "quorum": 2}},
    "granted":   {"approval": "required", "grants": [{"option": "approve-day", "scope": "requester", "for": "1h"}]}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// start runs the stages (nil: all four) with the counting tools, on env's
// server if h is given (a restart: same keys and tools), else a new one.
func start(t *testing.T, h *pt.H, stages []string, counters ...*pt.Counter) *pt.H {
	t.Helper()
	o := pt.Options{Policy: testPolicy, Stages: stages}
	for _, c := range counters {
		o.Tools = append(o.Tools, c)
	}
	if h != nil {
		o.Env, o.Keys = h.Env, h.Keys
		// The buckets may have been deleted and created again: bind anew.
		ctx, cancel := h.Ctx()
		defer cancel()
		b, err := topology.OpenBuckets(ctx, h.JS)
		if err != nil {
			t.Fatalf("open buckets: %v", err)
		}
		h.Env.Buckets = b
	}
	return pt.Start(t, o)
}

// run is replay.Run, failing the test on an error. Without a policy and
// keys it is given the stages' (testPolicy and h's keys), as `tollgate
// replay` loads them: a decision no stream keeps is judged again with
// them.
func run(t *testing.T, h *pt.H, o replay.Options) *replay.Report {
	t.Helper()
	if o.Policy == nil && o.Keys == nil {
		pol, err := policy.Parse([]byte(testPolicy))
		if err != nil {
			t.Fatal(err)
		}
		o.Policy, o.Keys = pol, h.Keys
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	rep, err := replay.Run(ctx, h.JS, o)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	return rep
}

// raw returns the bytes stored at key in kv, nil if there are none.
func raw(t *testing.T, h *pt.H, kv jetstream.KeyValue, key string) []byte {
	t.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %s/%s: %v", kv.Bucket(), key, err)
	}
	return e.Value()
}

// turnReport returns the report of turn, failing if there is none.
func turnReport(t *testing.T, rep *replay.Report, turn string) replay.TurnReport {
	t.Helper()
	for _, tr := range rep.Turns {
		if tr.TurnID == turn {
			return tr
		}
	}
	t.Fatalf("turn %s not in the report", turn)
	return replay.TurnReport{}
}

// withoutClock is a batch record's encoding with the two timestamps that
// only the stage's clock knew zeroed (the streams give approximations).
// withoutDecisionTimes returns approval record data with the times of its
// decision and votes zeroed, checking each is no later than it was: a
// decision no stream keeps is judged again at its message's stream time,
// a moment before the approver applied it (docs/operations.md).
func withoutDecisionTimes(t *testing.T, data []byte) []byte {
	t.Helper()
	a, err := schemas.Decode[schemas.ApprovalRecord](data)
	if err != nil {
		t.Fatalf("decode approval: %v", err)
	}
	if a.Decision != nil {
		a.Decision.DecidedAt = time.Time{}
	}
	for i := range a.Votes {
		a.Votes[i].DecidedAt = time.Time{}
	}
	out, err := schemas.Encode(a)
	if err != nil {
		t.Fatalf("encode approval: %v", err)
	}
	return out
}

func withoutClock(t *testing.T, data []byte) []byte {
	t.Helper()
	b, err := schemas.DecodeBatch(data)
	if err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	b.CreatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	// The claim of a call with a result says nothing its result does not
	// (it is in the record only: the streams carry the result); a claim
	// without a result is compared.
	keep := false
	for i := range b.Claims {
		if b.Results[i] != nil {
			b.Claims[i] = nil
		}
		keep = keep || b.Claims[i] != nil
	}
	if !keep {
		b.Claims = nil
	}
	out, err := schemas.Encode(b)
	if err != nil {
		t.Fatalf("encode batch: %v", err)
	}
	return out
}

// deleteBuckets deletes KV buckets, as an incident (or an operator) would.
func deleteBuckets(h *pt.H, names ...string) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	for _, b := range names {
		if err := h.JS.DeleteKeyValue(ctx, b); err != nil {
			h.T.Fatalf("delete bucket %s: %v", b, err)
		}
	}
}

// contextBytes is the msgpack encoding of a record's TurnContext.
func contextBytes(t *testing.T, tc *schemas.TurnContext) []byte {
	t.Helper()
	b, err := msgpack.Marshal(tc)
	if err != nil {
		t.Fatalf("marshal context: %v", err)
	}
	return b
}

func approve(h *pt.H, id string, who ...string) {
	h.T.Helper()
	for _, p := range who {
		h.Decide(id, schemas.OptionApprove, p)
	}
}

func TestRebuildBringsBackEveryRecordFromTheStreams(t *testing.T) {
	count, quorum := &pt.Counter{}, &pt.Counter{ToolName: "quorum"}
	h := start(t, nil, nil, count, quorum)

	// pending: an echo runs and a forbidden call is denied before the
	// batch waits on its count call; queued waits behind it (same session).
	pending := h.Send(h.Inbound("s-pending", "alice", pt.Call("echo", `{"text":"hi"}`), pt.Call("forbidden", `{}`), pt.Call("count", `{"n":1}`)))
	h.WaitPending(schemas.ApprovalID(pending, 2))
	queued := h.Send(h.Inbound("s-pending", "alice", pt.Call("count", `{"n":2}`)))
	h.WaitState(queued, schemas.BatchQueued)
	// waiting: one approval of two decided.
	waiting := h.Send(h.Inbound("s-waiting", "alice", pt.Call("count", `{"n":3}`), pt.Call("count", `{"n":4}`)))
	h.WaitPending(schemas.ApprovalID(waiting, 1))
	approve(h, schemas.ApprovalID(waiting, 0), "alice")
	h.WaitApproval(schemas.ApprovalID(waiting, 0), "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	// done: approved and run; voted: approved by a quorum of two.
	done := h.Send(h.Inbound("s-done", "alice", pt.Call("count", `{"n":5}`)))
	h.WaitPending(schemas.ApprovalID(done, 0))
	approve(h, schemas.ApprovalID(done, 0), "alice")
	voted := h.Send(h.Inbound("s-voted", "alice", pt.Call("quorum", `{"n":6}`)))
	h.WaitPending(schemas.ApprovalID(voted, 0))
	approve(h, schemas.ApprovalID(voted, 0), "bob", "carol")
	h.WaitTerminal(done)
	h.WaitTerminal(voted)
	// halfway: one vote of the two the quorum needs.
	halfway := h.Send(h.Inbound("s-halfway", "alice", pt.Call("quorum", `{"n":7}`)))
	h.WaitPending(schemas.ApprovalID(halfway, 0))
	approve(h, schemas.ApprovalID(halfway, 0), "bob")
	h.WaitApproval(schemas.ApprovalID(halfway, 0), "one vote", func(a *schemas.ApprovalRecord) bool { return len(a.Votes) == 1 })
	h.WaitIdle(pt.AllStages...)

	turns := []string{pending, queued, waiting, done, voted, halfway}
	// The batches as an earlier version left them, in tollgate_batches:
	// those a rebuild brings back (a turn's log is never rebuilt:
	// TestABatchKeptInItsTurnLogIsReadFromItAndNeverRebuilt).
	for _, turn := range turns {
		h.MakeBucketed(turn)
	}
	h.RecordSessions(turns...) // and the session records it kept with them
	approvals := []string{schemas.ApprovalID(pending, 2), schemas.ApprovalID(waiting, 0), schemas.ApprovalID(waiting, 1),
		schemas.ApprovalID(done, 0), schemas.ApprovalID(voted, 0), schemas.ApprovalID(halfway, 0)}
	before := map[string][]byte{}
	for _, turn := range turns {
		before[turn] = raw(t, h, h.Store.Batches.KV, turn)
	}
	for _, id := range approvals {
		before[id] = raw(t, h, h.Store.Approvals.KV, id)
	}

	if rep := run(t, h, replay.Options{}); rep.Changes != 0 || rep.Conflicts != 0 || len(rep.Turns) != len(turns) {
		t.Fatalf("report on intact KV: %d changes, %d conflicts, %d turns; want 0, 0, %d", rep.Changes, rep.Conflicts, len(rep.Turns), len(turns))
	}

	// The incident: both buckets are gone, with every stage stopped.
	h.Stop()
	deleteBuckets(h, topology.BucketApprovals, topology.BucketBatches)
	rep := run(t, h, replay.Options{Rebuild: true})
	if want := len(turns) + len(approvals); rep.Changes != want || rep.Conflicts != 0 {
		t.Fatalf("rebuild: %d changes, %d conflicts, want %d and 0\n%+v", rep.Changes, rep.Conflicts, want, rep)
	}
	// Every turn whose batch was written is nudged, except queued: the
	// session's active turn (pending) hands it on when it ends.
	if rep.Notices != len(turns)-1 || turnReport(t, rep, queued).Notice != "" {
		t.Fatalf("%d notices (queued's %q), want %d and none for the queued turn", rep.Notices, turnReport(t, rep, queued).Notice, len(turns)-1)
	}

	h2 := start(t, h, []string{}) // no stages: only to read the new buckets
	// The decisions were in the lost bucket only: they are judged again
	// from TOLLGATE_DECISIONS, each at its message's time.
	t.Run("every approval comes back byte for byte but for its decision times", func(t *testing.T) {
		for _, id := range approvals {
			got := raw(t, h2, h2.Store.Approvals.KV, id)
			if !bytes.Equal(withoutDecisionTimes(t, got), withoutDecisionTimes(t, before[id])) {
				t.Errorf("approval %s differs after the rebuild\n got %x\nwant %x", id, got, before[id])
			}
			g, _ := schemas.Decode[schemas.ApprovalRecord](got)
			w, _ := schemas.Decode[schemas.ApprovalRecord](before[id])
			if w.Decision != nil && (g.Decision == nil || g.Decision.DecidedAt.After(w.Decision.DecidedAt)) {
				t.Errorf("approval %s decided at %+v, want no later than %s", id, g.Decision, w.Decision.DecidedAt)
			}
		}
	})
	t.Run("a vote towards a quorum not yet reached comes back with it", func(t *testing.T) {
		id := schemas.ApprovalID(halfway, 0)
		got, err := schemas.Decode[schemas.ApprovalRecord](raw(t, h2, h2.Store.Approvals.KV, id))
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != schemas.ApprovalPending || len(got.Votes) != 1 || got.Votes[0].Principal != "cli:bob" {
			t.Fatalf("approval %s status %s votes %+v, want pending with bob's vote", id, got.Status, got.Votes)
		}
	})
	t.Run("every batch comes back byte for byte but for its two clock times", func(t *testing.T) {
		for _, turn := range turns {
			got := raw(t, h2, h2.Store.Batches.KV, turn)
			if !bytes.Equal(withoutClock(t, got), withoutClock(t, before[turn])) {
				t.Errorf("batch %s differs after the rebuild\n got %+v\nwant %+v", turn, decodeBatch(t, got), decodeBatch(t, before[turn]))
			}
		}
	})
	t.Run("every TurnContext is the sealed one, as it was", func(t *testing.T) {
		for _, turn := range turns {
			got, was := decodeBatch(t, raw(t, h2, h2.Store.Batches.KV, turn)), decodeBatch(t, before[turn])
			if !bytes.Equal(contextBytes(t, got.Context), contextBytes(t, was.Context)) {
				t.Errorf("turn %s: context differs", turn)
			}
			if err := h2.Keys.Verify(got.Context); err != nil {
				t.Errorf("turn %s: the rebuilt context's seal does not verify: %v", turn, err)
			}
		}
	})
	t.Run("a second replay changes nothing", func(t *testing.T) {
		rep := run(t, h2, replay.Options{Rebuild: true})
		if rep.Changes != 0 || rep.Notices != 0 || rep.Conflicts != 0 {
			t.Fatalf("second rebuild: %d changes, %d notices, %d conflicts; want none", rep.Changes, rep.Notices, rep.Conflicts)
		}
	})
	h2.Stop()

	// The stages come back; the pending approvals can be decided and every
	// call runs exactly once, none that ran before runs again.
	h3 := start(t, h, nil, count, quorum)
	approve(h3, schemas.ApprovalID(pending, 2), "alice")
	h3.WaitTerminal(pending)
	h3.WaitPending(schemas.ApprovalID(queued, 0))
	approve(h3, schemas.ApprovalID(queued, 0), "alice")
	approve(h3, schemas.ApprovalID(waiting, 1), "alice")
	approve(h3, schemas.ApprovalID(halfway, 0), "bob", "dave")
	for _, turn := range turns {
		b, _ := h3.WaitTerminal(turn)
		if b.State != schemas.BatchCompleted {
			t.Errorf("turn %s ended %s %s, want completed", turn, b.State, b.Code)
		}
	}
	h3.WaitIdle(pt.AllStages...)
	for _, call := range []string{schemas.CallID(pending, 2), schemas.CallID(queued, 0), schemas.CallID(waiting, 0), schemas.CallID(waiting, 1), schemas.CallID(done, 0)} {
		if n := count.Runs(call); n != 1 {
			t.Errorf("call %s ran %d times, want once", call, n)
		}
	}
	for _, call := range []string{schemas.CallID(voted, 0), schemas.CallID(halfway, 0)} {
		if n := quorum.Runs(call); n != 1 {
			t.Errorf("call %s ran %d times, want once", call, n)
		}
	}
	if b := h3.Batch(pending); b.Results[0].Status != schemas.ResultOK || b.Results[1].Code != schemas.CodePolicyDenied {
		t.Errorf("pending's calls before the wait: %+v %+v, want the echo ok and the denial kept", b.Results[0], b.Results[1])
	}
	for _, turn := range turns {
		if n := len(h3.Outcomes(turn)); n != 1 {
			t.Errorf("turn %s has %d outcomes, want 1", turn, n)
		}
	}
}

func decodeBatch(t *testing.T, data []byte) *schemas.BatchRecord {
	t.Helper()
	b, err := schemas.Decode[schemas.BatchRecord](data)
	if err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	return b
}
