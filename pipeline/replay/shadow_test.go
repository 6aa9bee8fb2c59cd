package replay_test

import (
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
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
	tampered := send("s-tampered", c)
	approve(h, schemas.ApprovalID(tampered, 0), "alice")
	lost := send("s-lost", c)
	approve(h, schemas.ApprovalID(lost, 0), "alice")
	changed := send("s-changed", pt.Call("risky", `{}`))
	approve(h, schemas.ApprovalID(changed, 0), "alice")
	for _, id := range []string{schemas.ApprovalID(approved, 0), schemas.ApprovalID(halfway, 0), schemas.ApprovalID(claimed, 0),
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
	call := schemas.CallID(claimed, 0)
	if _, err := h.Store.Claims.Create(ctx, call, &schemas.ExecutionClaim{CallID: call, TurnID: claimed, Tool: "count", Worker: "redriver@elsewhere", ClaimedAt: time.Now().UTC(),
		Result: &schemas.ToolResult{CallID: call, Tool: "count", Status: schemas.ResultOK, Output: "ran", FinishedAt: time.Now().UTC()}}); err != nil {
		t.Fatal(err)
	}
	h.MutateBatch(tampered, func(b *schemas.BatchRecord) { b.Context.Audience = schemas.AudiencePublic })
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
		{"an approved call already claimed: not run again, its claim's result", claimed, "started", "", "", replay.WouldNotRunAgain, schemas.ResultOK, ""},
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
	})
}
