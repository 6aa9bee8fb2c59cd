package replay_test

import (
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// retention is how long these tests' pipelines keep ended records, and
// their streams messages.
const retention = 4 * time.Second

// approvedTurn runs a turn whose one call ("count") is approved after
// waitBeforeDeciding, waits for its outcome and returns the turn id.
func approvedTurn(t *testing.T, h *pt.H, count *pt.Counter, session string, waitBeforeDeciding time.Duration) string {
	t.Helper()
	turn := h.Send(h.Inbound(session, "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	time.Sleep(waitBeforeDeciding) // the turn's messages are spread over time, not a wait for a condition
	h.Decide(id, schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted || count.Runs(schemas.CallID(turn, 0)) != 1 {
		t.Fatalf("turn ended %s with %d runs, want completed with 1", b.State, count.Runs(schemas.CallID(turn, 0)))
	}
	return turn
}

// recordsGone waits until turn's batch, approval and claim have left KV.
func recordsGone(t *testing.T, h *pt.H, turn string) {
	t.Helper()
	jstest.Eventually(t, jstest.LongWait, "records of "+turn+" removed after the retention", func() bool {
		return h.Batch(turn) == nil && h.Approval(schemas.ApprovalID(turn, 0)) == nil && raw(t, h, h.Env.Buckets.Claims, schemas.CallID(turn, 0)) == nil
	})
}

// settled waits until the redriver has handled every event it was sent.
func settled(t *testing.T, h *pt.H) {
	t.Helper()
	jstest.EventuallyState(t, pt.Wait, "redriver consumer settled", func() (bool, string) {
		ctx, cancel := h.Ctx()
		defer cancel()
		return jstest.CaughtUp(ctx, h.JS, topology.StreamEvents, topology.ConsumerRedriver)
	})
}

// After a turn's records have left KV, the streams no longer hold its
// accepted message (they keep messages no longer than the retention, and
// the records' retention starts when the batch ends, after it): a rebuild
// reads turns from their accepted message, so it finds nothing to rebuild
// from what may be left of the turn's events, and brings back neither the
// approval, pending or decided, nor the batch.
func TestARebuildAfterTheRetentionBringsNothingBack(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}, Retention: retention})
	// Decided well after it was accepted, so that the turn's events are
	// spread over time.
	turn := approvedTurn(t, h, count, "expired", retention/2)
	recordsGone(t, h, turn)
	if got := h.Messages(topology.StreamTurns, topology.AcceptedSubject(schemas.SessionKey("cli", "expired"))); len(got) != 0 {
		t.Fatalf("the turns stream still holds %d accepted messages of the turn after its records left KV", len(got))
	}

	rep := run(t, h, replay.Options{Rebuild: true})
	for _, tr := range rep.Turns {
		if tr.TurnID == turn {
			t.Fatalf("the rebuild found turn %s: %+v", turn, tr)
		}
	}
	if rep.Changes != 0 {
		t.Fatalf("the rebuild wrote %d records: %+v", rep.Changes, rep)
	}
	if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
		t.Fatalf("the rebuild brought the approval back: %+v", a)
	}
	if b := h.Batch(turn); b != nil {
		t.Fatalf("the rebuild brought the batch back: %+v", b)
	}
}

// Streams kept longer than the records (their max age raised after the
// turn, or a rebuild from a backup of them): a rebuild of a turn whose
// records have left KV writes what the streams prove (the approval as
// decided, never pending; the batch as completed) and runs nothing again:
// the batch it nudges is terminal, so the redriver only finishes it, finds
// the outcome already published, and publishes none.
func TestARebuildOfAnExpiredTurnWritesItAsItEnded(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}, Retention: retention})
	turn := approvedTurn(t, h, count, "kept", 0)
	ctx := jstest.Ctx(t)
	for _, name := range []string{topology.StreamTurns, topology.StreamEvents} {
		s, err := h.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxAge = time.Hour
		if _, err := h.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	recordsGone(t, h, turn)

	rep := run(t, h, replay.Options{Rebuild: true})
	if rep.Notices == 0 {
		t.Fatalf("the rebuild nudged nothing: %+v", rep)
	}
	settled(t, h)
	if a := h.Approval(schemas.ApprovalID(turn, 0)); a == nil || a.Status != schemas.ApprovalApproved {
		t.Fatalf("rebuilt approval %+v, want approved", a)
	}
	if b := h.Batch(turn); b == nil || b.State != schemas.BatchCompleted {
		t.Fatalf("rebuilt batch %+v, want completed", b)
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("the call ran %d times, want 1", n)
	}
	if got := h.Outcomes(turn); len(got) != 1 {
		t.Fatalf("%d outcomes of the turn, want 1", len(got))
	}
}
