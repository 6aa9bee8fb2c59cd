package replay_test

import (
	"fmt"
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
	if got := h.Messages(topology.StreamTurns, topology.OrderWildcard(schemas.SessionKey("cli", "expired"))); len(got) != 0 {
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
// approval has left KV writes what the streams prove (the approval as
// decided, never pending) and runs nothing again. The streams include the
// turn logs: the turn's batch is its log, which keeps it (and its outcome,
// the log's outcome event, published nowhere) as long as the other streams
// keep the turn, so the batch never left; the replay reads it completed
// from there (Read takes the outcome from the log), never rebuilds it, and
// the batch it nudges is terminal: the redriver only finishes it, finds the
// outcome in the log, and publishes none.
func TestARebuildOfAnExpiredTurnWritesItAsItEnded(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}, Retention: retention})
	turn := approvedTurn(t, h, count, "kept", 0)
	streams := []string{topology.StreamTurns, topology.StreamEvents, topology.StreamDecisions}
	for i := range h.Store.Batches.Log.Log.Partitions() {
		streams = append(streams, topology.TurnLogStream(i))
	}
	keepLonger(t, h, streams...)
	jstest.Eventually(t, jstest.LongWait, "the approval of "+turn+" removed after the retention", func() bool {
		return h.Approval(schemas.ApprovalID(turn, 0)) == nil && raw(t, h, h.Env.Buckets.Claims, schemas.CallID(turn, 0)) == nil
	})
	if b := h.Batch(turn); b == nil || b.Bucketed() || b.State != schemas.BatchCompleted {
		t.Fatalf("batch %+v, want the completed one its turn's log keeps", b)
	}

	rep := run(t, h, replay.Options{Rebuild: true})
	if tr := turnReport(t, rep, turn); tr.State != schemas.BatchCompleted || tr.Batch.Action != replay.Unchanged {
		t.Fatalf("turn report %+v, want the streams saying completed (its log's outcome) and the batch unchanged", tr)
	}
	if rep.Notices == 0 {
		t.Fatalf("the rebuild nudged nothing: %+v", rep)
	}
	settled(t, h)
	if a := h.Approval(schemas.ApprovalID(turn, 0)); a == nil || a.Status != schemas.ApprovalApproved {
		t.Fatalf("rebuilt approval %+v, want approved", a)
	}
	if b := h.Batch(turn); b == nil || b.Bucketed() || b.State != schemas.BatchCompleted {
		t.Fatalf("batch %+v after the rebuild, want its log's, completed", b)
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("the call ran %d times, want 1", n)
	}
	if got := h.Outcomes(turn); len(got) != 1 {
		t.Fatalf("%d outcomes of the turn, want 1", len(got))
	}
}

// The turn logs expired while the other streams were kept longer (their
// max age raised, the logs' not): nothing left proves the turn ended, its
// log is empty, and the call may have run. The rebuild takes the batch for
// lost, never for one not yet written: it is rebuilt with its unfinished
// call claimed, so the call never runs again (a redrive ends it needing
// attention, EXECUTION_UNCERTAIN).
func TestARebuildAfterTheTurnLogsExpiredRunsNothingAgain(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}, Retention: retention})
	turn := approvedTurn(t, h, count, "logs-expired", 0)
	keepLonger(t, h, topology.StreamTurns, topology.StreamEvents)
	recordsGone(t, h, turn) // the batch too: its log's events aged out

	rep := run(t, h, replay.Options{Rebuild: true})
	if tr := turnReport(t, rep, turn); tr.Batch.Action == replay.Unchanged {
		t.Fatalf("turn report %+v, want the lost batch rebuilt", tr)
	}
	settled(t, h)
	// The executor takes the nudged batch on: its call is claimed, so
	// whatever comes next (the recovery sweep's redrive) ends it needing
	// attention, never runs it.
	var b *schemas.BatchRecord
	jstest.EventuallyState(t, pt.Wait, "the rebuilt batch of "+turn+" taken on", func() (bool, string) {
		b = h.Batch(turn)
		if b == nil {
			return false, "no batch"
		}
		return b.State != schemas.BatchQueued, fmt.Sprintf("%+v", b)
	})
	if c := b.ClaimOf(0); c == nil || b.Results[0] != nil {
		t.Fatalf("batch %+v: want call 0 claimed with no result (it may have run)", b)
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("the call ran %d times, want 1", n)
	}
}

// keepLonger raises the max age of each named stream to an hour: the
// streams kept longer than the records.
func keepLonger(t *testing.T, h *pt.H, streams ...string) {
	t.Helper()
	ctx := jstest.Ctx(t)
	for _, name := range streams {
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
}
