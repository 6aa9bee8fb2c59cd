package replay_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// findChange returns the change of key in rep (batches and approvals).
func findChange(t *testing.T, rep *replay.Report, key string) replay.Change {
	t.Helper()
	for _, tr := range rep.Turns {
		if tr.Batch.Key == key {
			return tr.Batch
		}
		for _, c := range tr.Approvals {
			if c.Key == key {
				return c
			}
		}
	}
	t.Fatalf("no change for %s in the report", key)
	return replay.Change{}
}

func TestRebuildIntoExistingBucketsOnlyFillsMissingOrOlderRecords(t *testing.T) {
	h := start(t, nil, nil, &pt.Counter{})
	send := func(session string) string {
		turn := h.Send(h.Inbound(session, "alice", pt.Call("count", `{"n":1}`)))
		h.WaitPending(schemas.ApprovalID(turn, 0))
		return turn
	}
	done := send("s-done")
	approve(h, schemas.ApprovalID(done, 0), "alice")
	h.WaitTerminal(done)
	missing, ahead, tampered, garbled := send("s-missing"), send("s-ahead"), send("s-tampered"), send("s-garbled")
	h.WaitIdle(pt.AllStages...)
	h.Stop() // as the operating guide says: no stage runs during a rebuild
	// The batches as an earlier version left them, in tollgate_batches,
	// where the rebuild rule applies to them (a turn's log is never
	// rebuilt), with the outcome of the ended one published, as that
	// version published it.
	for _, turn := range []string{done, missing, ahead, tampered, garbled} {
		h.MakeBucketed(turn)
	}
	h.RecordSessions(done, missing, ahead, tampered, garbled) // and the session records it kept

	for _, tc := range []struct {
		name   string
		key    string
		batch  bool // key is in the batches bucket (else approvals)
		edit   func(h *pt.H, key string)
		action replay.Action
		// afterwards KV holds: the bytes from before the edit (restored),
		// or those the edit left (kept)
		restored bool
	}{
		{"a missing approval is created as it was", schemas.ApprovalID(missing, 0), false,
			func(h *pt.H, key string) { deleteKey(h, false, key) }, replay.Create, true},
		{"a missing batch is created as the streams have it", missing, true,
			func(h *pt.H, key string) { deleteKey(h, true, key) }, replay.Create, true},
		{"a pending approval the events say was approved moves forward", schemas.ApprovalID(done, 0), false,
			func(h *pt.H, key string) {
				h.MutateApproval(key, func(a *schemas.ApprovalRecord) { a.Status, a.Decision = schemas.ApprovalPending, nil })
			}, replay.Update, true},
		{"an awaiting batch the outcome says completed moves forward", done, true,
			func(h *pt.H, key string) {
				h.MutateBatch(key, func(b *schemas.BatchRecord) { b.State, b.Results[0] = schemas.BatchAwaiting, nil })
			}, replay.Update, true},
		{"an approval further along than the events is left alone", schemas.ApprovalID(ahead, 0), false,
			func(h *pt.H, key string) {
				h.MutateApproval(key, func(a *schemas.ApprovalRecord) {
					a.Status, a.Decision = schemas.ApprovalDenied, &schemas.DecisionInfo{Principal: "cli:alice", Option: "deny", DecidedAt: time.Now().UTC()}
				})
			}, replay.Unchanged, false},
		{"a batch with an edited TurnContext is a conflict and left alone", tampered, true,
			func(h *pt.H, key string) {
				h.MutateBatch(key, func(b *schemas.BatchRecord) { b.State, b.Context.TrustBoundary = schemas.BatchQueued, "edited" })
			}, replay.Conflict, false},
		{"an approval with another call is a conflict and left alone", schemas.ApprovalID(tampered, 0), false,
			func(h *pt.H, key string) {
				h.MutateApproval(key, func(a *schemas.ApprovalRecord) { a.Args, a.ArgsDigest = `{"n":2}`, schemas.ArgsDigest(`{"n":2}`) })
			}, replay.Conflict, false},
		{"a record that does not decode is left alone", garbled, true,
			func(h *pt.H, key string) { h.PutRaw(h.Store.Batches.KV, key, []byte{0xc1}) }, replay.Kept, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			kv := h.Store.Approvals.KV
			if tc.batch {
				kv = h.Store.Batches.KV
			}
			orig := raw(t, h, kv, tc.key)
			tc.edit(h, tc.key)
			edited := raw(t, h, kv, tc.key)

			c := findChange(t, run(t, h, replay.Options{Rebuild: true}), tc.key)
			if c.Action != tc.action {
				t.Fatalf("change %+v, want %s", c, tc.action)
			}
			got, want := raw(t, h, kv, tc.key), edited
			if tc.restored {
				want = orig
			}
			switch {
			case tc.batch && tc.restored:
				got, want = withoutClock(t, got), withoutClock(t, want)
			case tc.restored:
				// The edit replaced the decided revision (the bucket keeps
				// one): the decision is judged again, at its message's time.
				got, want = withoutDecisionTimes(t, got), withoutDecisionTimes(t, want)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("KV after the rebuild\n got %x\nwant %x (restored %v)", got, want, tc.restored)
			}
		})
	}

	t.Run("a second replay writes nothing and still reports the conflicts", func(t *testing.T) {
		h := h.For(t)
		rep := run(t, h, replay.Options{Rebuild: true})
		if rep.Changes != 0 || rep.Notices != 0 || rep.Conflicts != 2 {
			t.Fatalf("%d changes, %d notices, %d conflicts; want 0, 0, 2", rep.Changes, rep.Notices, rep.Conflicts)
		}
	})

	t.Run("a call that ran but lost its execution claim is warned about", func(t *testing.T) {
		h := h.For(t)
		call := schemas.CallID(done, 0)
		rep := run(t, h, replay.Options{})
		if slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, call) }) {
			t.Fatalf("warnings %q: a version 2 batch's claims are in its record, not in %s", rep.Warnings, topology.BucketClaims)
		}
		// A version 1 batch's claims are records of tollgate_claims: one
		// that is gone (purged, restored from an old backup) is warned
		// about.
		h.MutateBatch(done, func(b *schemas.BatchRecord) { *b = *schemas.AsLegacyBatch(b) }) // in the bucket already
		if b := h.Batch(done); !b.Legacy() || !b.Bucketed() {
			t.Fatalf("batch %s was not rewritten as version 1 in the bucket", done)
		}
		ctx, cancel := h.Ctx()
		defer cancel()
		if err := h.Store.Claims.KV.Purge(ctx, call); err != nil {
			t.Fatal(err)
		}
		rep = run(t, h, replay.Options{})
		if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, call) && strings.Contains(w, "no execution claim") }) {
			t.Fatalf("warnings %q, want one about %s", rep.Warnings, call)
		}
	})
}

func deleteKey(h *pt.H, batch bool, key string) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	kv := h.Store.Approvals.KV
	if batch {
		kv = h.Store.Batches.KV
	}
	if err := kv.Delete(ctx, key); err != nil {
		h.T.Fatalf("delete %s: %v", key, err)
	}
}

func TestRangeSelectsTurnsByTheirAcceptedMessage(t *testing.T) {
	h := start(t, nil, nil)
	var turns []string
	for range 3 {
		turn := h.Send(h.Inbound("s-range", "alice", pt.Call("echo", `{"text":"x"}`)))
		h.WaitTerminal(turn)
		turns = append(turns, turn)
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	all, err := replay.Read(ctx, h.JS, replay.Range{})
	if err != nil || len(all.Turns) != 3 {
		t.Fatalf("read everything: %v, %d turns", err, len(all.Turns))
	}
	first, second, third := all.Turns[0], all.Turns[1], all.Turns[2]

	for _, tc := range []struct {
		name string
		r    replay.Range
		want []string
	}{
		{"no bounds: every turn, in accepted order", replay.Range{}, turns},
		{"from the second turn's sequence", replay.Range{FromSeq: second.Seq}, turns[1:]},
		{"up to the second turn's sequence", replay.Range{ToSeq: second.Seq}, turns[:2]},
		{"exactly one sequence", replay.Range{FromSeq: second.Seq, ToSeq: second.Seq}, turns[1:2]},
		{"since the third turn was accepted", replay.Range{Since: third.Accepted}, turns[2:]},
		{"until the first turn was accepted", replay.Range{Until: first.Accepted}, turns[:1]},
		{"past the last message: nothing", replay.Range{FromSeq: third.Seq + 100}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := h.Ctx()
			defer cancel()
			hist, err := replay.Read(ctx, h.JS, tc.r)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, turn := range hist.Turns {
				got = append(got, turn.TurnID)
				if turn.Batch.State != schemas.BatchCompleted {
					t.Errorf("turn %s projected %s, want completed (its events are read whatever the range)", turn.TurnID, turn.Batch.State)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("turns %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a range that ends before it starts is refused", func(t *testing.T) {
		if _, err := replay.Read(ctx, h.JS, replay.Range{FromSeq: 5, ToSeq: 4}); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestRunRefusesWhatCouldLoseSafety(t *testing.T) {
	h := start(t, nil, nil)
	turn := h.Send(h.Inbound("s-refuse", "alice", pt.Call("echo", `{"text":"x"}`)))
	h.WaitTerminal(turn)
	h.Stop()

	for _, tc := range []struct {
		name  string
		setup func(h *pt.H)
		o     replay.Options
		want  string
	}{
		{"rebuild and dry-run together", nil, replay.Options{Rebuild: true, DryRun: true}, "exclude each other"},
		{"a dry run without the keys and policy", nil, replay.Options{DryRun: true}, "seal keys"},
		{"a rebuild without the claims bucket", func(h *pt.H) {
			deleteBuckets(h, topology.BucketClaims)
			deleteKey(h, true, turn)
		}, replay.Options{Rebuild: true}, "tollgate_claims is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			if tc.setup != nil {
				tc.setup(h)
			}
			ctx, cancel := h.Ctx()
			defer cancel()
			_, err := replay.Run(ctx, h.JS, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if b := raw(t, h, h.Store.Batches.KV, turn); tc.setup != nil && b != nil {
				t.Fatalf("the refused rebuild wrote the batch")
			}
		})
	}
}

// Losing the sessions bucket loses no turn's place: this version keeps a
// session's order in TOLLGATE_TURNS (its entries and the batches'
// places), so a rebuild creates no session record, and the turns still
// run one at a time, in order.
func TestLosingTheSessionsBucketLosesNoTurnOrder(t *testing.T) {
	count := &pt.Counter{}
	h := start(t, nil, nil, count)
	first := h.Send(h.Inbound("s-queue", "alice", pt.Call("count", `{"n":1}`)))
	h.WaitPending(schemas.ApprovalID(first, 0))
	second := h.Send(h.Inbound("s-queue", "alice", pt.Call("count", `{"n":2}`)))
	h.WaitState(second, schemas.BatchQueued)
	h.WaitIdle(pt.AllStages...)
	h.Stop()
	deleteBuckets(h, topology.BucketBatches, topology.BucketSessions)

	rep := run(t, h, replay.Options{Rebuild: true})
	if len(rep.Sessions) != 0 {
		t.Fatalf("sessions %+v, want none rebuilt", rep.Sessions)
	}
	h2 := start(t, h, nil, count)
	if s := h2.Session("s-queue"); s != nil {
		t.Fatalf("session record %+v, want none", s)
	}
	approve(h2, schemas.ApprovalID(first, 0), "alice")
	b1, _ := h2.WaitTerminal(first)
	h2.WaitPending(schemas.ApprovalID(second, 0))
	if b2 := h2.Batch(second); b2.OrderAfter != first {
		t.Fatalf("the second turn waited behind %q, want %s", b2.OrderAfter, first)
	}
	approve(h2, schemas.ApprovalID(second, 0), "alice")
	b2, _ := h2.WaitTerminal(second)
	h2.WaitIdle(pt.AllStages...)
	for _, call := range []string{schemas.CallID(first, 0), schemas.CallID(second, 0)} {
		if n := count.Runs(call); n != 1 {
			t.Errorf("call %s ran %d times, want once", call, n)
		}
	}
	if b2.Claims[0].ClaimedAt.Before(b1.UpdatedAt) {
		t.Fatalf("the second turn's call was claimed at %v, before the first ended at %v", b2.Claims[0].ClaimedAt, b1.UpdatedAt)
	}
}

func TestATurnTheExecutorNeverSawIsRebuiltQueuedAndNudgedReady(t *testing.T) {
	count := &pt.Counter{}
	h := start(t, nil, []string{pt.Ingest}, count) // the executor is down
	m := h.Inbound("s-unseen", "alice", pt.Call("count", `{"n":1}`))
	turn := schemas.TurnID(m.Transport, m.MessageID)
	// Wait for ingest to have acknowledged this very message, not for its
	// consumer to look idle: the server acks a publish before it tells the
	// consumers, so right after Send the consumer can still report nothing
	// pending, and Stop would then end ingest before it accepted the turn.
	h.WaitConsumed(pt.Ingest, h.Publish(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), m))
	h.Stop()

	rep := run(t, h, replay.Options{Rebuild: true})
	tr := turnReport(t, rep, turn)
	if tr.State != schemas.BatchQueued || tr.Batch.Action != replay.Create || tr.Notice != topology.ReadySubject(schemas.SessionKey("cli", "s-unseen")) {
		t.Fatalf("turn report %+v, want a queued batch created and a ready notice", tr)
	}
	h2 := start(t, h, nil, count)
	h2.WaitPending(schemas.ApprovalID(turn, 0))
	approve(h2, schemas.ApprovalID(turn, 0), "alice")
	h2.WaitTerminal(turn)
	h2.WaitIdle(pt.AllStages...)
	if n := count.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("call ran %d times, want once", n)
	}
	if n := len(h2.Requested(turn)); n != 1 {
		t.Fatalf("%d approval prompts, want 1 (the accepted turn and the nudge are one batch)", n)
	}
}

// A batch that was running a call when its bucket was lost: the call was
// claimed in the batch record, which the streams do not hold, so the
// rebuilt record claims it (replay.RebuildWorker) and the call is reported
// uncertain, never run again. A later turn of the same session, queued
// behind it, ran nothing and is rebuilt without claims: it runs.
func TestALostRunningBatchIsRebuiltWithItsCallsClaimed(t *testing.T) {
	free := &pt.Counter{ToolName: "free"}
	h := start(t, nil, []string{pt.Ingest}, free) // the executor is down
	// Two turns as an earlier version (the batches in tollgate_batches)
	// accepted them: on the accepted subject, not in the session's order.
	var turns []string
	accepted := map[string]*schemas.AcceptedTurn{}
	for i := range 2 {
		at := h.Accept(h.Inbound("s-lost", "alice", pt.Call("free", fmt.Sprintf(`{"n":%d}`, i))))
		turns, accepted[at.TurnID] = append(turns, at.TurnID), at
		h.Publish(topology.AcceptedSubject(schemas.SessionKeyOf(at.Context)), topology.AcceptedMsgID(at.TurnID), at)
	}
	// What an executor of that version that died mid-call left: the first
	// turn running, its call claimed and no result; then the batches
	// bucket is lost.
	ctx, cancel := h.Ctx()
	defer cancel()
	for i, turn := range turns {
		at := accepted[turn]
		if at == nil {
			t.Fatalf("no accepted turn %s", turn)
		}
		b := &schemas.BatchRecord{TurnID: turn, SessionID: "s-lost", Context: at.Context, Text: at.Text, Calls: at.Calls, State: schemas.BatchQueued,
			Approvals: make([]string, 1), Results: make([]*schemas.ToolResult, 1), CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
		if i == 0 {
			b.State = schemas.BatchRunning
			b.SetClaim(0, &schemas.CallClaim{Worker: "executor@dead", ClaimedAt: time.Now().UTC()})
		}
		if _, err := h.Store.Batches.Create(ctx, turn, schemas.AsBucketedBatch(b)); err != nil {
			t.Fatal(err)
		}
	}
	h.Stop()
	deleteBuckets(h, topology.BucketBatches, topology.BucketSessions)

	rep := run(t, h, replay.Options{Rebuild: true})
	h2 := start(t, h, []string{})
	if c := h2.Batch(turns[0]).ClaimOf(0); c == nil || c.Worker != replay.RebuildWorker {
		t.Fatalf("rebuilt first turn's claim %+v, want one by %s (report %+v)", c, replay.RebuildWorker, rep)
	}
	if c := h2.Batch(turns[1]).ClaimOf(0); c != nil {
		t.Fatalf("rebuilt second turn's claim %+v, want none: it was queued behind the first", c)
	}
	h2.Stop()

	h3 := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: testPolicy, Tools: []tools.Tool{free}, ClaimLease: 2 * time.Second, ToolTimeout: time.Second})
	first, _ := h3.WaitTerminal(turns[0])
	if r := first.Results[0]; r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain {
		t.Fatalf("first turn's result %+v, want needs_attention EXECUTION_UNCERTAIN", r)
	}
	second, _ := h3.WaitTerminal(turns[1])
	if r := second.Results[0]; r.Status != schemas.ResultOK {
		t.Fatalf("second turn's result %+v, want ok", r)
	}
	if n, m := free.Runs(schemas.CallID(turns[0], 0)), free.Runs(schemas.CallID(turns[1], 0)); n != 0 || m != 1 {
		t.Fatalf("runs %d and %d, want 0 (it may have run before the loss) and 1", n, m)
	}
}
