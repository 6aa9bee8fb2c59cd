package approver_test

import (
	"maps"
	"sync"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/schemas"
)

// watchedRevision waits until the approver's pending tracker holds the
// revision of approval id that the bucket holds, and returns it.
func watchedRevision(h *pt.H, id string) (*schemas.ApprovalRecord, uint64) {
	h.T.Helper()
	var data *schemas.ApprovalRecord
	var rev uint64
	jstest.Eventually(h.T, pt.Wait, "the pending tracker watched approval "+id, func() bool {
		var ok bool
		data, rev, ok = approver.Latest(h.Approver, id)
		ctx, cancel := h.Ctx()
		defer cancel()
		e, err := h.Store.Approvals.KV.Get(ctx, id)
		return ok && err == nil && e.Revision() == rev
	})
	return data, rev
}

// A decision is applied on the approval's revision the pending tracker
// watched, without reading the bucket: the compare-and-set at that
// revision is the check that it is current.
func TestADecisionOnAWatchedApprovalReadsNothing(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	turn, id := pendingWrite(h, "watched", "watched.txt")
	watchedRevision(h, id)
	gets, err := h.Env.NC.SubscribeSync("$JS.API.DIRECT.GET." + "KV_" + topology.BucketApprovals + ".>")
	if err != nil {
		t.Fatal(err)
	}
	defer gets.Unsubscribe()
	if err := h.Env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	if err := h.Approver.Apply(ctx, h.Decision(id, schemas.OptionApprove, "cli", "bob")); err != nil {
		t.Fatal(err)
	}
	if err := h.Env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	var approverReads []string
	for {
		m, err := gets.NextMsg(0)
		if err != nil {
			break
		}
		approverReads = append(approverReads, m.Subject)
	}
	if a := h.Approval(id); a == nil || a.Status != schemas.ApprovalApproved {
		t.Fatalf("approval after the decision: %+v, want approved", a)
	}
	if len(approverReads) != 0 {
		t.Fatalf("the decision read the approvals bucket: %v; want no read (the watched revision)", approverReads)
	}
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
		t.Fatalf("batch %s, want completed", b.State)
	}
}

// A watch that lags behind the bucket never decides: a decision made on
// a stale watched revision fails its compare-and-set and is decided again
// on a fresh read. Here the approval was approved since the revision the
// tracker holds; a later deny by another decider is rejected
// APPROVAL_ALREADY_DECIDED, the approval stays approved, and its call runs
// once.
func TestAStaleWatchedApprovalDecidesNothing(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	turn, id := pendingWrite(h, "stale", "stale.txt")
	pending, rev := watchedRevision(h, id)
	ctx, cancel := h.Ctx()
	defer cancel()
	if err := h.Approver.Apply(ctx, h.Decision(id, schemas.OptionApprove, "cli", "alice")); err != nil {
		t.Fatal(err)
	}
	h.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	jstest.Eventually(t, pt.Wait, "the tracker drops the decided approval", func() bool {
		_, _, ok := approver.Latest(h.Approver, id)
		return !ok
	})
	approver.SetLatest(h.Approver, id, pending, rev) // the watch lags: it still shows the approval pending

	deny := h.Decision(id, schemas.OptionDeny, "cli", "bob")
	if err := h.Approver.Apply(ctx, deny); err != nil {
		t.Fatal(err)
	}
	if r := h.WaitRejection(deny); r.Code != schemas.CodeApprovalAlreadyDecided {
		t.Fatalf("the deny on a stale watched revision: %+v, want rejected %s", r, schemas.CodeApprovalAlreadyDecided)
	}
	a := h.Approval(id)
	if a == nil || a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.Principal != "cli:alice" {
		t.Fatalf("approval after the stale deny: %+v, want approved by alice", a)
	}
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("batch %s %+v, want completed with the write done", b.State, b.Results[0])
	}
}

// The approver decodes each revision of an approval once: its pending
// tracker decodes what its watch delivers, and a decision on the watched
// revision is made on that record, not on its bytes decoded again.
func TestEachWatchedRevisionIsDecodedOnce(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
	var mu sync.Mutex
	decoded := map[string]int{} // approval id and status -> decodes
	st := *h.Store
	decode := st.Approvals.DecodeValue
	st.Approvals.Decode = func(b []byte) (*schemas.ApprovalRecord, error) {
		rec, err := decode(b)
		if err == nil {
			mu.Lock()
			decoded[rec.ApprovalID+" "+string(rec.Status)]++
			mu.Unlock()
		}
		return rec, err
	}
	a := h.RunApproverOn(&st)

	turn, id := pendingWrite(h, "decoded-once", "once.txt")
	jstest.Eventually(t, pt.Wait, "the tracker holds the pending approval", func() bool {
		_, _, ok := approver.Latest(a, id)
		return ok
	})
	actx, acancel := h.Ctx()
	defer acancel()
	if err := a.Apply(actx, h.Decision(id, schemas.OptionApprove, "cli", "bob")); err != nil {
		t.Fatal(err)
	}
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
		t.Fatalf("batch %s, want completed", b.State)
	}
	// The later fact: the tracker has decoded the decided revision.
	jstest.Eventually(t, pt.Wait, "the tracker drops the decided approval", func() bool {
		_, _, ok := approver.Latest(a, id)
		return !ok
	})
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{id + " pending": 1, id + " approved": 1}
	if !maps.Equal(decoded, want) {
		t.Fatalf("decodes by revision: %v, want %v (each revision decoded once, by the tracker)", decoded, want)
	}
}

// Two decisions on one watched approval at once are each made on the
// tracker's record (shared between them, read-only) and one of them
// decides: the other's compare-and-set fails, it is decided again on a
// fresh read and rejected APPROVAL_ALREADY_DECIDED. Under -race, a write
// to the shared record by either would be reported.
func TestTwoDecisionsOnAWatchedApprovalAtOnce(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	turn, id := pendingWrite(h, "at-once", "at-once.txt")
	watchedRevision(h, id)
	approve := h.Decision(id, schemas.OptionApprove, "cli", "alice")
	deny := h.Decision(id, schemas.OptionDeny, "cli", "bob")
	var wg sync.WaitGroup
	for _, d := range []*schemas.Decision{approve, deny} {
		wg.Go(func() {
			ctx, cancel := h.Ctx()
			defer cancel()
			if err := h.Approver.Apply(ctx, d); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	a := h.Approval(id)
	if a == nil || a.Decision == nil {
		t.Fatalf("approval after both decisions: %+v, want decided", a)
	}
	winner, loser := approve, deny
	if a.Status == schemas.ApprovalDenied {
		winner, loser = deny, approve
	}
	if a.Decision.DecisionID != winner.DecisionID {
		t.Fatalf("approval %s decided by %s, want %s", a.Status, a.Decision.DecisionID, winner.DecisionID)
	}
	if r := h.WaitRejection(loser); r.Code != schemas.CodeApprovalAlreadyDecided {
		t.Fatalf("the losing decision: %+v, want rejected %s", r, schemas.CodeApprovalAlreadyDecided)
	}
	h.WaitTerminal(turn)
}
