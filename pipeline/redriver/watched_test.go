package redriver_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// awaitingKept waits until the redriver's sweep keeps turn's awaiting
// event, and returns it.
func awaitingKept(h *pt.H, turn string) turnlog.Event {
	h.T.Helper()
	var ev turnlog.Event
	jstest.Eventually(h.T, pt.Wait, "the sweep keeps the awaiting event of "+turn, func() bool {
		var ok bool
		ev, ok = redriver.AwaitingEvent(h.Redriver, turn)
		return ok
	})
	return ev
}

// A decision on a batch whose awaiting event the recovery sweep's watch
// delivered moves it on without reading the turn's log: no message get of
// a turn-log stream until the outcome is appended.
func TestADecisionOnAWatchedBatchReadsNoTurnLog(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("watched", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	awaitingKept(h, turn)

	nc := h.Env.NC
	gets, err := nc.SubscribeSync("$JS.API.DIRECT.GET.>") // and the leader's message gets below
	if err != nil {
		t.Fatal(err)
	}
	defer gets.Unsubscribe()
	msgGets, err := nc.SubscribeSync("$JS.API.STREAM.MSG.GET.>")
	if err != nil {
		t.Fatal(err)
	}
	defer msgGets.Unsubscribe()
	outcome, err := nc.SubscribeSync(topology.SubjectTurnLogPrefix + "*." + turn + ".outcome")
	if err != nil {
		t.Fatal(err)
	}
	defer outcome.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	h.Decide(id, schemas.OptionApprove, "alice")
	if _, err := outcome.NextMsg(pt.Wait); err != nil {
		t.Fatalf("no outcome appended to the turn's log: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var logReads []string
	for _, sub := range []*nats.Subscription{gets, msgGets} {
		for {
			m, err := sub.NextMsg(0)
			if err != nil {
				break
			}
			if strings.Contains(m.Subject, "."+topology.StreamTurnLogPrefix) {
				logReads = append(logReads, m.Subject)
			}
		}
	}
	if len(logReads) != 0 {
		t.Fatalf("reads of a turn log before the outcome: %v; want none", logReads)
	}
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted || count.Total() != 1 {
		t.Fatalf("batch %s, tool ran %d times; want completed, once", b.State, count.Total())
	}
}

// A watched awaiting event that is stale (the batch ended since) never
// moves the batch: the start's compare-and-set at its sequence fails, the
// batch is read again and found ended, and nothing runs, even for a
// decision that approves the call.
func TestAStaleWatchedBatchRunsNothing(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("stale", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	stale := awaitingKept(h, turn)
	h.Decide(id, schemas.OptionDeny, "alice")
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted || b.Results[0].Status == schemas.ResultOK {
		t.Fatalf("denied batch: %s %+v", b.State, b.Results[0])
	}
	jstest.Eventually(t, pt.Wait, "the sweep drops the ended batch's awaiting event", func() bool {
		_, ok := redriver.AwaitingEvent(h.Redriver, turn)
		return !ok
	})
	h.WaitIdle(pt.AllStages...)
	ctx, cancel := h.Ctx()
	defer cancel()
	before, err := h.Store.Batches.Log.Log.Last(ctx, turn)
	if err != nil {
		t.Fatal(err)
	}

	redriver.KeepAwaiting(h.Redriver, stale) // the watch lags: it still shows the batch awaiting
	approved := h.Approval(id)
	approved.Status = schemas.ApprovalApproved // a decision that would run the call
	if err := redriver.RedriveWatched(ctx, h.Redriver, turn, &store.Decision{Record: approved, Retained: true}); err != nil {
		t.Fatalf("redrive on a stale watched batch: %v", err)
	}
	if n := count.Total(); n != 0 {
		t.Fatalf("tool ran %d times on a stale watched batch, want never", n)
	}
	if after, err := h.Store.Batches.Log.Log.Last(ctx, turn); err != nil || after.Seq != before.Seq || after.Name != before.Name {
		t.Fatalf("the turn's last event went from %s@%d to %+v (%v); want none appended", before.Name, before.Seq, after, err)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
}
