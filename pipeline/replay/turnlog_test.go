package replay_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// lastLogSeq is the sequence of turn's last event in its log.
func lastLogSeq(t *testing.T, h *pt.H, turn string) uint64 {
	t.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	ev, err := h.Store.Batches.Log.Log.Last(ctx, turn)
	if err != nil {
		t.Fatalf("last event of %s: %v", turn, err)
	}
	return ev.Seq
}

// A batch created since the turn logs is its turn's log, a stream: a
// replay reports it unchanged from there, a rebuild never writes it (not
// into its log, not into tollgate_batches, even when that bucket is lost),
// and the dry run judges the log's own record.
func TestABatchKeptInItsTurnLogIsReadFromItAndNeverRebuilt(t *testing.T) {
	// No redriver: the approved batch stays awaiting.
	h := start(t, nil, []string{pt.Ingest, pt.Executor, pt.Approver}, &pt.Counter{})
	turn := h.Send(h.Inbound("s-log", "alice", pt.Call("count", `{"n":1}`)))
	h.WaitState(turn, schemas.BatchAwaiting)
	approve(h, schemas.ApprovalID(turn, 0), "alice")
	h.WaitApproval(schemas.ApprovalID(turn, 0), "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	h.WaitIdle(pt.Ingest, pt.Executor, pt.Approver)
	h.Stop()
	if b := h.Batch(turn); b == nil || b.Bucketed() {
		t.Fatalf("batch %+v, want one in its turn's log", b)
	}
	seq := lastLogSeq(t, h, turn)

	fromLog := func(t *testing.T, rep *replay.Report) replay.TurnReport {
		t.Helper()
		tr := turnReport(t, rep, turn)
		if c := tr.Batch; c.Action != replay.Unchanged || c.KV != string(schemas.BatchAwaiting) || !strings.Contains(c.Reason, "turn's log") ||
			!strings.Contains(c.Reason, topology.StreamTurnLogPrefix) {
			t.Fatalf("batch change %+v, want unchanged, awaiting, kept in its turn's log", c)
		}
		return tr
	}

	t.Run("a report reads the batch from its log", func(t *testing.T) {
		h := h.For(t)
		if rep := run(t, h, replay.Options{}); rep.Changes != 0 || rep.Conflicts != 0 {
			t.Fatalf("%d changes, %d conflicts, want none: %+v", rep.Changes, rep.Conflicts, rep)
		}
		fromLog(t, run(t, h, replay.Options{}))
	})

	t.Run("losing tollgate_batches loses nothing of it and a rebuild writes nothing of it", func(t *testing.T) {
		h := h.For(t)
		deleteBuckets(h, topology.BucketBatches)
		rep := run(t, h, replay.Options{Rebuild: true})
		fromLog(t, rep)
		if rep.Changes != 0 || rep.Notices != 0 {
			t.Fatalf("%d changes, %d notices, want none: %+v", rep.Changes, rep.Notices, rep)
		}
		if !slices.ContainsFunc(rep.Warnings, func(w string) bool {
			return strings.Contains(w, topology.BucketBatches) && strings.Contains(w, "created")
		}) {
			t.Fatalf("warnings %q, want the batches bucket created", rep.Warnings)
		}
		h2 := start(t, h, []string{}) // only to bind the new bucket
		if b := raw(t, h2, h2.Store.Batches.KV, turn); b != nil {
			t.Fatalf("the rebuild wrote the batch into %s", topology.BucketBatches)
		}
		if got := lastLogSeq(t, h2, turn); got != seq {
			t.Fatalf("the turn's log moved from %d to %d", seq, got)
		}
		if b := h2.Batch(turn); b == nil || b.Bucketed() || b.State != schemas.BatchAwaiting {
			t.Fatalf("batch %+v, want the log's, awaiting", b)
		}
		if rep := run(t, h2, replay.Options{Rebuild: true}); rep.Changes != 0 || rep.Notices != 0 {
			t.Fatalf("second rebuild: %d changes, %d notices, want none", rep.Changes, rep.Notices)
		}
		h2.Stop()
	})

	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("the dry run judges the log's record: intact, then tampered", func(t *testing.T) {
		h := h.For(t)
		if s := fromLog(t, run(t, h, replay.Options{DryRun: true, Keys: h.Keys, Policy: pol})).Shadow; s == nil || s.Kind != "started" ||
			len(s.Calls) != 1 || s.Calls[0].Would != replay.WouldRun {
			t.Fatalf("shadow %+v, want started, the call would run", s)
		}
		h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.Audience = schemas.AudiencePublic })
		seq := lastLogSeq(t, h, turn)
		rep := run(t, h, replay.Options{DryRun: true, Keys: h.Keys, Policy: pol})
		if s := fromLog(t, rep).Shadow; s == nil || s.Kind != "failed" || s.Code != schemas.CodeTurnContextTampered {
			t.Fatalf("shadow %+v, want failed %s", s, schemas.CodeTurnContextTampered)
		}
		// A rebuild leaves the tampered record where it is, as it is.
		if rep := run(t, h, replay.Options{Rebuild: true}); rep.Changes != 0 || turnReport(t, rep, turn).Batch.Action != replay.Unchanged {
			t.Fatalf("rebuild of a tampered log: %d changes, batch %+v; want none, unchanged", rep.Changes, turnReport(t, rep, turn).Batch)
		}
		if got := lastLogSeq(t, h, turn); got != seq {
			t.Fatalf("the turn's log moved from %d to %d", seq, got)
		}
	})

	t.Run("a log record that does not decode is kept, and judged by no one", func(t *testing.T) {
		h := h.For(t)
		h.PutRawBatch(turn, []byte{0xc1})
		rep := run(t, h, replay.Options{DryRun: true, Keys: h.Keys, Policy: pol})
		tr := turnReport(t, rep, turn)
		if tr.Batch.Action != replay.Kept || tr.Batch.KV != "undecodable" || !strings.Contains(tr.Batch.Reason, "turn's log") {
			t.Fatalf("batch change %+v, want kept, undecodable, in its turn's log", tr.Batch)
		}
		if tr.Shadow == nil || tr.Shadow.Kind != "none" {
			t.Fatalf("shadow %+v, want none", tr.Shadow)
		}
		if rep := run(t, h, replay.Options{Rebuild: true}); rep.Changes != 0 {
			t.Fatalf("rebuild: %d changes, want none", rep.Changes)
		}
		if b := raw(t, h, h.Store.Batches.KV, turn); b != nil {
			t.Fatalf("the rebuild wrote the batch into %s", topology.BucketBatches)
		}
	})
}

// A queued turn whose turn-log stream was deleted and made again after it
// was accepted may have been running its calls in the log that was lost:
// it is rebuilt, into the bucket, with its calls claimed (as for a lost
// batches bucket), never to run them again without a person.
func TestATurnWhoseLogStreamWasMadeAgainIsRebuiltAsMaybeRunning(t *testing.T) {
	count := &pt.Counter{}
	h := start(t, nil, []string{pt.Ingest}, count) // the executor is down
	m := h.Inbound("s-relog", "alice", pt.Call("count", `{"n":1}`))
	turn := schemas.TurnID(m.Transport, m.MessageID)
	h.WaitConsumed(pt.Ingest, h.Publish(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), m))
	h.Stop()

	ctx, cancel := h.Ctx()
	defer cancel()
	name := topology.TurnLogStream(topology.TurnLogPartition(turn, h.Store.Batches.Log.Log.Partitions()))
	s, err := h.JS.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := h.JS.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := h.JS.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	rep := run(t, h, replay.Options{Rebuild: true})
	if tr := turnReport(t, rep, turn); tr.Batch.Action != replay.Create {
		t.Fatalf("batch change %+v, want created", tr.Batch)
	}
	h2 := start(t, h, []string{})
	b := h2.Batch(turn)
	if b == nil || !b.Bucketed() {
		t.Fatalf("rebuilt batch %+v, want one in %s", b, topology.BucketBatches)
	}
	if c := b.ClaimOf(0); c == nil || c.Worker != replay.RebuildWorker {
		t.Fatalf("rebuilt claim %+v, want one by %s", c, replay.RebuildWorker)
	}
}

// A turn's outcome is the one its log's outcome event keeps, published
// nowhere: Read projects the batch ended from it, keeps it over a
// published copy that differs (noted), and falls back to the published
// copy when the turn's log stream is gone, without failing.
func TestReadTakesATurnsOutcomeFromItsLog(t *testing.T) {
	h := start(t, nil, nil)
	turn := h.Send(h.Inbound("s-outcome", "alice", pt.Call("echo", `{"text":"x"}`)))
	h.WaitTerminal(turn)
	h.WaitIdle(pt.AllStages...)
	h.Stop()
	logged := h.Outcomes(turn)
	if len(logged) != 1 || len(h.PublishedOutcomes(turn)) != 0 {
		t.Fatalf("%d outcomes, %d published; want the log's alone", len(logged), len(h.PublishedOutcomes(turn)))
	}
	read := func(t *testing.T, h *pt.H) *replay.Turn {
		t.Helper()
		ctx, cancel := h.Ctx()
		defer cancel()
		hist, err := replay.Read(ctx, h.JS, replay.Range{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range hist.Turns {
			if tt.TurnID == turn {
				return tt
			}
		}
		t.Fatalf("turn %s not read", turn)
		return nil
	}

	t.Run("the log's outcome ends the batch", func(t *testing.T) {
		h := h.For(t)
		b := read(t, h).Batch
		if b.State != schemas.BatchCompleted || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK {
			t.Fatalf("batch %s, results %+v; want completed with the echo's result", b.State, b.Results)
		}
	})
	published := *logged[0]
	published.State, published.Code = schemas.TurnFailed, schemas.CodeTurnContextTampered
	t.Run("a published copy that differs is noted, the log's is kept", func(t *testing.T) {
		h := h.For(t)
		h.Publish(topology.EventSubject(topology.SubjectTurnOutcome, turn), topology.OutcomeMsgID(turn), &published)
		tt := read(t, h)
		if tt.Batch.State != schemas.BatchCompleted {
			t.Fatalf("batch %s, want completed (its log's outcome)", tt.Batch.State)
		}
		if !slices.ContainsFunc(tt.Notes, func(n string) bool { return strings.Contains(n, "differs from the one its turn log keeps") }) {
			t.Fatalf("notes %q, want one about the published copy", tt.Notes)
		}
	})
	t.Run("without the turn's log stream, the published copy", func(t *testing.T) {
		h := h.For(t)
		ctx, cancel := h.Ctx()
		defer cancel()
		if err := h.JS.DeleteStream(ctx, topology.TurnLogStream(topology.TurnLogPartition(turn, h.Store.Batches.Log.Log.Partitions()))); err != nil {
			t.Fatal(err)
		}
		if b := read(t, h).Batch; b.State != schemas.BatchFailed || b.Code != schemas.CodeTurnContextTampered {
			t.Fatalf("batch %s %s, want the published copy's, failed %s", b.State, b.Code, schemas.CodeTurnContextTampered)
		}
	})
}

// A request is kept by its batch's move to awaiting, in the turn's log:
// with the approvals bucket lost and no approval-requested event left
// (this version's readers move off them), a rebuild takes the pending
// approval from the log, byte for byte the record announced, and a
// decision on it runs the call.
func TestARebuildTakesTheRequestsFromTheTurnLog(t *testing.T) {
	count := &pt.Counter{}
	h := start(t, nil, []string{pt.Ingest, pt.Executor}, count)
	turn := h.Send(h.Inbound("s-requests", "alice", pt.Call("count", `{"n":1}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitState(turn, schemas.BatchAwaiting)
	logged := h.LoggedRequests(turn)
	if len(logged) != 1 || logged[0].ApprovalID != id {
		t.Fatalf("the awaiting event requests %+v, want %s", logged, id)
	}
	h.WaitIdle(pt.Ingest, pt.Executor)
	h.Stop()

	ctx, cancel := h.Ctx()
	defer cancel()
	events, err := h.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Purge(ctx, jetstream.WithPurgeSubject(topology.EventSubject(topology.SubjectApprovalRequested, turn))); err != nil {
		t.Fatal(err)
	}
	if n := len(h.PublishedRequests(turn)); n != 0 {
		t.Fatalf("%d approval-requested events left, want none", n)
	}
	deleteBuckets(h, topology.BucketApprovals)

	rep := run(t, h, replay.Options{Rebuild: true})
	tr := turnReport(t, rep, turn)
	if len(tr.Approvals) != 1 || tr.Approvals[0].Action != replay.Create {
		t.Fatalf("approval changes %+v, want %s created", tr.Approvals, id)
	}
	h2 := start(t, h, []string{pt.Ingest, pt.Executor, pt.Approver, pt.Redriver}, count)
	got := raw(t, h2, h2.Store.Approvals.KV, id)
	want, err := schemas.Encode(logged[0])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("rebuilt approval\n%x\nwant the log's request\n%x", got, want)
	}
	approve(h2, id, "alice")
	b, _ := h2.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || count.Total() != 1 {
		t.Fatalf("batch %s, %d runs; want completed, the call run once", b.State, count.Total())
	}
}

// A decision is its approval record's revision in the approvals bucket;
// losing the bucket loses its stream, and this version publishes no
// decided event. With the policy and the seal keys, a rebuild judges the
// decisions TOLLGATE_DECISIONS keeps again, as the approver did: an
// applied decision comes back (with its quorum votes, and a vote towards a
// quorum not yet reached), one that was rejected does not; the batch
// waiting for a decision still missing resumes once it is made, and no
// call runs twice. Without them, the approvals come back pending, but for
// a batch that started: its started event keeps the decisions.
func TestARebuildJudgesTheDecisionsNoStreamKeeps(t *testing.T) {
	count, quorum := &pt.Counter{}, &pt.Counter{ToolName: "quorum"}
	h := start(t, nil, nil, count, quorum)
	waiting := h.Send(h.Inbound("s-judge-waiting", "alice", pt.Call("count", `{"n":1}`), pt.Call("count", `{"n":2}`)))
	first, second := schemas.ApprovalID(waiting, 0), schemas.ApprovalID(waiting, 1)
	h.WaitPending(second)
	if rej := h.WaitRejection(h.Decide(first, schemas.OptionDeny, "mallory")); rej.Code != schemas.CodeDeciderNotAuthorized {
		t.Fatalf("mallory's deny was rejected %s, want %s", rej.Code, schemas.CodeDeciderNotAuthorized)
	}
	approve(h, first, "alice")
	h.WaitApproval(first, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	voted := h.Send(h.Inbound("s-judge-voted", "alice", pt.Call("quorum", `{"n":3}`)))
	halfway := h.Send(h.Inbound("s-judge-halfway", "alice", pt.Call("quorum", `{"n":4}`)))
	h.WaitPending(schemas.ApprovalID(voted, 0))
	h.WaitPending(schemas.ApprovalID(halfway, 0))
	approve(h, schemas.ApprovalID(voted, 0), "bob", "carol")
	approve(h, schemas.ApprovalID(halfway, 0), "dave")
	h.WaitTerminal(voted)
	h.WaitApproval(schemas.ApprovalID(halfway, 0), "one vote", func(a *schemas.ApprovalRecord) bool { return len(a.Votes) == 1 })
	h.WaitIdle(pt.AllStages...)
	before := map[string]*schemas.ApprovalRecord{}
	for _, id := range []string{first, second, schemas.ApprovalID(voted, 0), schemas.ApprovalID(halfway, 0)} {
		before[id] = h.Approval(id)
	}
	h.Stop()

	// The incident: the approvals bucket is lost, and no decided event is
	// stored (an earlier version's would be read: purged here).
	ctx, cancel := h.Ctx()
	defer cancel()
	events, err := h.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Purge(ctx, jetstream.WithPurgeSubject(topology.SubjectApprovalDecided+">")); err != nil {
		t.Fatal(err)
	}
	deleteBuckets(h, topology.BucketApprovals)

	// Without the policy and keys: nothing to judge with, all pending but
	// the approval of the batch that started, whose started event keeps
	// the decision it passed on.
	hist, err := replay.Read(ctx, h.JS, replay.Range{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range hist.Turns {
		for _, a := range tr.Approvals {
			started := a.ApprovalID == schemas.ApprovalID(voted, 0)
			if started && (a.Status != before[a.ApprovalID].Status || len(a.Votes) != len(before[a.ApprovalID].Votes)) {
				t.Fatalf("read without a judge: approval %s %s with %d votes, want it as its started event keeps it", a.ApprovalID, a.Status, len(a.Votes))
			}
			if !started && (a.Status != schemas.ApprovalPending || len(a.Votes) != 0) {
				t.Fatalf("read without a judge: approval %s %s with %d votes, want pending", a.ApprovalID, a.Status, len(a.Votes))
			}
		}
	}

	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, h, replay.Options{Rebuild: true, Policy: pol, Keys: h.Keys})
	if rep.Conflicts != 0 {
		t.Fatalf("rebuild: %d conflicts\n%+v", rep.Conflicts, rep)
	}
	h2 := start(t, h, []string{pt.Ingest, pt.Executor, pt.Approver, pt.Redriver}, count, quorum)
	same := func(id string, a *schemas.ApprovalRecord) {
		t.Helper()
		was := before[id]
		if a == nil || a.Status != was.Status || (was.Decision == nil) != (a.Decision == nil) || len(a.Votes) != len(was.Votes) {
			t.Fatalf("approval %s rebuilt as %+v, want %s with %d votes as it was", id, a, was.Status, len(was.Votes))
		}
		if was.Decision != nil && (a.Decision.DecisionID != was.Decision.DecisionID || a.Decision.Principal != was.Decision.Principal ||
			a.Decision.Option != was.Decision.Option || a.Decision.DecidedAt.After(was.Decision.DecidedAt)) {
			t.Fatalf("approval %s decision %+v, want %+v (at its submission, no later)", id, a.Decision, was.Decision)
		}
		for i := range a.Votes {
			if a.Votes[i].Principal != was.Votes[i].Principal || a.Votes[i].DecisionID != was.Votes[i].DecisionID {
				t.Fatalf("approval %s vote %d %+v, want %+v", id, i, a.Votes[i], was.Votes[i])
			}
		}
	}
	for id := range before {
		same(id, h2.Approval(id))
	}
	approve(h2, second, "alice")
	if b, _ := h2.WaitTerminal(waiting); b.State != schemas.BatchCompleted {
		t.Fatalf("the waiting batch ended %s", b.State)
	}
	for _, c := range []struct {
		call string
		n    int
	}{{schemas.CallID(waiting, 0), 1}, {schemas.CallID(waiting, 1), 1}, {schemas.CallID(voted, 0), 1}, {schemas.CallID(halfway, 0), 0}} {
		if got := count.Runs(c.call) + quorum.Runs(c.call); got != c.n {
			t.Fatalf("call %s ran %d times, want %d", c.call, got, c.n)
		}
	}
}

// decideByRequest approves approval id as who through the approver's
// decision service (pipeline/submit), once the service answers, and
// checks that it was applied there: no stream but the approvals bucket's
// keeps it.
func decideByRequest(t *testing.T, h *pt.H, id, who string) {
	t.Helper()
	h.WaitDecisionService()
	ctx, cancel := h.Ctx()
	defer cancel()
	a, err := submit.Decision(ctx, h.JS, h.Decision(id, schemas.OptionApprove, "cli", who))
	if err != nil || a.Result != submit.Applied {
		t.Fatalf("decision on %s by request: %+v, %v; want applied", id, a, err)
	}
}

// A decision sent to the approver as a request is stored by no stream
// but the approvals bucket's, and by the started event of its batch
// (schemas.BatchRecord.Decided), which is all a rebuild finds of it once
// that bucket is lost: a batch that started comes back with its
// approvals decided as they were, without a judge, and runs nothing
// again; a decision of a batch still waiting (on a sibling) is lost with
// the bucket, and its approval comes back pending, for a person to
// decide again (the safe direction).
func TestARebuildTakesTheDecisionsMadeByRequestFromTheStartedEvent(t *testing.T) {
	count := &pt.Counter{}
	h := start(t, nil, nil, count)
	ended := h.Send(h.Inbound("s-request-ended", "alice", pt.Call("count", `{"n":1}`)))
	waiting := h.Send(h.Inbound("s-request-waiting", "alice", pt.Call("count", `{"n":2}`), pt.Call("count", `{"n":3}`)))
	endedID, first, second := schemas.ApprovalID(ended, 0), schemas.ApprovalID(waiting, 0), schemas.ApprovalID(waiting, 1)
	h.WaitPending(endedID)
	h.WaitPending(second)
	decideByRequest(t, h, endedID, "alice")
	decideByRequest(t, h, first, "alice")
	if b, _ := h.WaitTerminal(ended); b.State != schemas.BatchCompleted {
		t.Fatalf("the decided batch ended %s", b.State)
	}
	h.WaitIdle(pt.AllStages...)
	was := h.Approval(endedID)
	for _, id := range []string{endedID, first} {
		if got := h.Messages(topology.StreamDecisions, topology.DecisionSubject("cli", id)); len(got) != 0 {
			t.Fatalf("TOLLGATE_DECISIONS keeps %d decisions on %s: it was not decided by request", len(got), id)
		}
	}
	h.Stop()
	deleteBuckets(h, topology.BucketApprovals)

	ctx, cancel := h.Ctx()
	defer cancel()
	hist, err := replay.Read(ctx, h.JS, replay.Range{})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]*schemas.ApprovalRecord{}
	for _, tr := range hist.Turns {
		for _, a := range tr.Approvals {
			status[a.ApprovalID] = a
		}
	}
	if a := status[endedID]; a == nil || a.Status != schemas.ApprovalApproved || a.Decision == nil ||
		a.Decision.DecisionID != was.Decision.DecisionID || a.Decision.Principal != was.Decision.Principal || !a.Decision.DecidedAt.Equal(was.Decision.DecidedAt) {
		t.Fatalf("read after the loss: %s is %+v, want approved by %+v as it was", endedID, a, was.Decision)
	}
	for _, id := range []string{first, second} {
		if a := status[id]; a == nil || a.Status != schemas.ApprovalPending {
			t.Fatalf("read after the loss: %s is %+v, want pending (its batch never started)", id, a)
		}
	}

	if rep := run(t, h, replay.Options{Rebuild: true}); rep.Conflicts != 0 {
		t.Fatalf("rebuild: %d conflicts\n%+v", rep.Conflicts, rep)
	}
	h2 := start(t, h, []string{pt.Ingest, pt.Executor, pt.Approver, pt.Redriver}, count)
	if a := h2.Approval(endedID); a == nil || a.Status != schemas.ApprovalApproved || a.Decision.DecisionID != was.Decision.DecisionID {
		t.Fatalf("rebuilt %s: %+v, want approved by %s", endedID, a, was.Decision.DecisionID)
	}
	approve(h2, first, "alice")
	approve(h2, second, "alice")
	if b, _ := h2.WaitTerminal(waiting); b.State != schemas.BatchCompleted {
		t.Fatalf("the waiting batch ended %s", b.State)
	}
	h2.WaitIdle(pt.AllStages...)
	for _, call := range []string{schemas.CallID(ended, 0), schemas.CallID(waiting, 0), schemas.CallID(waiting, 1)} {
		if n := count.Runs(call); n != 1 {
			t.Fatalf("call %s ran %d times, want once", call, n)
		}
	}
}
