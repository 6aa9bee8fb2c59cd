package replay_test

import (
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// laterPolicy is testPolicy after a deploy that denies risky outright.
var laterPolicy = strings.Replace(testPolicy, `"risky":     {"approval": "required"}`, `"risky":     {"approval": "deny"}`, 1)

// lastSeqs is the last sequence of every stream, the KV buckets' included.
func lastSeqs(t *testing.T, h *pt.H) map[string]uint64 {
	t.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	out := map[string]uint64{}
	for name := range h.JS.StreamNames(ctx).Name() {
		s, err := h.JS.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out[name] = info.State.LastSeq
	}
	if len(out) < 9 {
		t.Fatalf("only %d streams: %v", len(out), out)
	}
	return out
}

func TestDryRunReportsWhatEachBatchWouldDoAndDoesNothing(t *testing.T) {
	count, risky := &pt.Counter{}, &pt.Counter{ToolName: "risky"}
	// No redriver: decided batches stay awaiting, as after a redriver
	// outage or a rebuild.
	h := start(t, nil, []string{pt.Ingest, pt.Executor, pt.Approver}, count, risky)
	send := func(session string, calls ...schemas.ProposedCall) string {
		turn := h.Send(h.Inbound(session, "alice", calls...))
		h.WaitState(turn, schemas.BatchAwaiting)
		return turn
	}
	decided := func(id string, s schemas.ApprovalStatus) {
		h.WaitApproval(id, string(s), func(a *schemas.ApprovalRecord) bool { return a.Status == s })
	}
	c := pt.Call("count", `{"n":1}`)

	approved := send("s-approved", c)
	approve(h, schemas.ApprovalID(approved, 0), "alice")
	halfway := send("s-halfway", c, c)
	approve(h, schemas.ApprovalID(halfway, 0), "alice")
	denied := send("s-denied", c)
	h.Decide(schemas.ApprovalID(denied, 0), schemas.OptionDeny, "alice")
	claimed := send("s-claimed", c)
	approve(h, schemas.ApprovalID(claimed, 0), "alice")
	claimedV1 := send("s-claimed-v1", c)
	approve(h, schemas.ApprovalID(claimedV1, 0), "alice")
	tampered := send("s-tampered", c)
	approve(h, schemas.ApprovalID(tampered, 0), "alice")
	lost := send("s-lost", c)
	approve(h, schemas.ApprovalID(lost, 0), "alice")
	changed := send("s-changed", pt.Call("risky", `{}`))
	approve(h, schemas.ApprovalID(changed, 0), "alice")
	for _, id := range []string{schemas.ApprovalID(approved, 0), schemas.ApprovalID(halfway, 0), schemas.ApprovalID(claimed, 0), schemas.ApprovalID(claimedV1, 0),
		schemas.ApprovalID(tampered, 0), schemas.ApprovalID(lost, 0), schemas.ApprovalID(changed, 0)} {
		decided(id, schemas.ApprovalApproved)
	}
	decided(schemas.ApprovalID(denied, 0), schemas.ApprovalDenied)
	fast := h.Send(h.Inbound("s-fast", "alice", pt.Call("echo", `{"text":"x"}`)))
	h.WaitTerminal(fast)
	h.WaitIdle(pt.Ingest, pt.Executor, pt.Approver)
	h.Stop()

	// The KV side of an incident or two: a call that ran elsewhere (its
	// claim recorded), a context edited in place, a batch record lost.
	ctx, cancel := h.Ctx()
	defer cancel()
	// Claimed in its batch record by a redriver that started it elsewhere
	// and has recorded no result yet.
	h.MutateBatch(claimed, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchStarted
		b.SetClaim(0, &schemas.CallClaim{Worker: "redriver@elsewhere", ClaimedAt: time.Now().UTC()})
	})
	// A version 1 batch, whose claim (with its result) is a record of
	// tollgate_claims.
	h.MakeLegacy(claimedV1)
	call := schemas.CallID(claimedV1, 0)
	if _, err := h.Store.Claims.Create(ctx, call, &schemas.ExecutionClaim{CallID: call, TurnID: claimedV1, Tool: "count", Worker: "redriver@elsewhere", ClaimedAt: time.Now().UTC(),
		Result: &schemas.ToolResult{CallID: call, Tool: "count", Status: schemas.ResultOK, Output: "ran", FinishedAt: time.Now().UTC()}}); err != nil {
		t.Fatal(err)
	}
	// Edited in its turn's log: the dry run judges the log's record.
	h.MutateBatch(tampered, func(b *schemas.BatchRecord) { b.Context.Audience = schemas.AudiencePublic })
	// An earlier version's batch, in tollgate_batches, lost from it (a
	// turn's log is never lost that way, nor rebuilt).
	h.MakeBucketed(lost)
	h.RecordSessions(claimedV1, lost) // the session records the earlier versions kept for theirs
	deleteKey(h, true, lost)

	pol, err := policy.Parse([]byte(laterPolicy))
	if err != nil {
		t.Fatal(err)
	}
	seqs, ran := lastSeqs(t, h), count.Total()+risky.Total()
	rep := run(t, h, replay.Options{DryRun: true, Keys: h.Keys, Policy: pol})

	for _, tc := range []struct {
		name     string
		turn     string
		kind     string
		code     schemas.Code
		reason   string // in the verdict's reason
		would    string // the first call's, for started
		status   schemas.ResultStatus
		callCode schemas.Code
	}{
		{"every approval decided: started, the approved call would run", approved, "started", "", "", replay.WouldRun, "", ""},
		{"one of two approvals still pending: deferred", halfway, "deferred", "", "1 approval(s) pending", "", "", ""},
		{"a denied approval: started, the call would not run", denied, "started", "", "", replay.WouldNotRun, schemas.ResultDenied, schemas.CodeApprovalDenied},
		{"an approved call claimed in its started batch: not run again", claimed, "started", "", "", replay.WouldNotRunAgain, "", ""},
		{"a version 1 batch's approved call already claimed: not run again, its claim's result", claimedV1, "started", "", "", replay.WouldNotRunAgain, schemas.ResultOK, ""},
		{"a context edited in KV: failed, nothing runs", tampered, "failed", schemas.CodeTurnContextTampered, "does not match", "", "", ""},
		{"a batch missing from KV is judged as the streams rebuild it", lost, "started", "", "", replay.WouldRun, "", ""},
		{"a tool the current policy denies: the approved call would not run", changed, "started", "", "", replay.WouldNotRun, schemas.ResultFailed, schemas.CodePolicyChanged},
		{"a finished turn: nothing to redrive", fast, "none", "", "completed", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := turnReport(t, rep, tc.turn).Shadow
			if s == nil {
				t.Fatal("no shadow verdict")
			}
			if s.Kind != tc.kind || s.Code != tc.code || !strings.Contains(s.Reason, tc.reason) {
				t.Fatalf("verdict %+v, want %s %s with a reason saying %q", s, tc.kind, tc.code, tc.reason)
			}
			if tc.would == "" {
				if len(s.Calls) != 0 {
					t.Fatalf("calls %+v, want none", s.Calls)
				}
				return
			}
			if len(s.Calls) != 1 || s.Calls[0].Would != tc.would || s.Calls[0].Status != tc.status || s.Calls[0].Code != tc.callCode {
				t.Fatalf("calls %+v, want one that would %q with %s %s", s.Calls, tc.would, tc.status, tc.callCode)
			}
		})
	}

	t.Run("no tool ran and nothing was published or written", func(t *testing.T) {
		if n := count.Total() + risky.Total(); n != ran {
			t.Errorf("%d tool runs during the dry run", n-ran)
		}
		after := lastSeqs(t, h)
		for name, seq := range seqs {
			if after[name] != seq {
				t.Errorf("stream %s: last seq %d before the dry run, %d after", name, seq, after[name])
			}
		}
		if rep.Notices != 0 || rep.Changes != 1 {
			t.Errorf("%d notices and %d changes a rebuild would make, want 0 and 1 (the lost batch)", rep.Notices, rep.Changes)
		}
		if b := raw(t, h, h.Store.Batches.KV, lost); b != nil {
			t.Error("the dry run wrote the lost batch")
		}
		if c := turnReport(t, rep, tampered).Batch; c.Action != replay.Unchanged || !strings.Contains(c.Reason, "turn's log") {
			t.Errorf("tampered batch's change %+v, want unchanged, kept in its turn's log", c)
		}
	})
}

// TestDryRunRechecksTheGrant: the shadow redrive applies the redriver's
// grant re-check (redriver.RecheckGrant) to a call a standing grant
// approved: while the grant stands it would run; once the grant expired
// (a clock past its expiry) or was revoked (grants.Revoke, as `tollgate
// grants revoke` does) it would not run, failed GRANT_EXPIRED or
// GRANT_REVOKED; the call the grant was made on (a person's decision) is
// not re-checked. Nothing runs.
func TestDryRunRechecksTheGrant(t *testing.T) {
	granted := &pt.Counter{ToolName: "granted"}
	// No redriver: decided batches stay awaiting.
	h := start(t, nil, []string{pt.Ingest, pt.Executor, pt.Approver}, granted)
	made := h.Send(h.Inbound("s-made", "alice", pt.Call("granted", `{"n":1}`)))
	h.WaitState(made, schemas.BatchAwaiting)
	d := h.Decide(schemas.ApprovalID(made, 0), "approve-day", "alice")
	gid := schemas.GrantID(schemas.ApprovalID(made, 0), d.DecisionID)
	jstest.Eventually(t, pt.Wait, "grant "+gid, func() bool { // made before the next call is planned
		ctx, cancel := h.Ctx()
		defer cancel()
		_, _, err := h.Store.Grants.Get(ctx, gid)
		return err == nil
	})
	used := h.Send(h.Inbound("s-used", "alice", pt.Call("granted", `{"n":2}`)))
	a := h.WaitApproval(schemas.ApprovalID(used, 0), "decided by the grant", func(a *schemas.ApprovalRecord) bool {
		return a.Status == schemas.ApprovalApproved && a.Decision != nil && a.Decision.Grant != nil
	})
	if a.Decision.Grant.GrantID != gid {
		t.Fatalf("decided by grant %s, want %s", a.Decision.Grant.GrantID, gid)
	}
	h.WaitState(used, schemas.BatchAwaiting)
	h.WaitIdle(pt.Ingest, pt.Executor, pt.Approver)
	h.Stop()

	would := func(rep *replay.Report, turn string) replay.ShadowCall {
		t.Helper()
		s := turnReport(t, rep, turn).Shadow
		if s == nil || s.Kind != "started" || len(s.Calls) != 1 {
			t.Fatalf("turn %s: shadow %+v", turn, s)
		}
		return s.Calls[0]
	}
	o := replay.Options{DryRun: true, Keys: h.Keys, Policy: h.Policy}
	if c := would(run(t, h, o), used); c.Would != replay.WouldRun {
		t.Fatalf("while the grant stands: %+v", c)
	}
	later := o
	later.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if c := would(run(t, h, later), used); c.Would != replay.WouldNotRun || c.Status != schemas.ResultFailed || c.Code != schemas.CodeGrantExpired {
		t.Fatalf("after the grant expired: %+v", c)
	}
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := grants.Revoke(ctx, h.JS, h.Store, gid, "operator", "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	rep := run(t, h, o)
	if c := would(rep, used); c.Would != replay.WouldNotRun || c.Status != schemas.ResultFailed || c.Code != schemas.CodeGrantRevoked {
		t.Fatalf("after the grant was revoked: %+v", c)
	}
	if c := would(rep, made); c.Would != replay.WouldRun {
		t.Fatalf("the call the grant was made on: %+v", c)
	}
	if granted.Total() != 0 {
		t.Fatalf("%d calls ran", granted.Total())
	}
}
