package approver_test

import (
	"context"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"sync/atomic"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const expiryPolicy = `{
  "version": "expiry-test",
  "tools": {
    "write_file": {"approval": "required", "expires_after": "1s"},
    "count":      {"approval": "required", "expires_after": "none"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// wantExpired checks that the turn ended with the call expired, announced
// by a decided event with status expired, and that nothing was written.
func wantExpired(t *testing.T, h *pt.H, turn, id, path string) {
	t.Helper()
	b, out := h.WaitTerminal(turn)
	if r := b.Results[0]; b.State != schemas.BatchCompleted || r.Status != schemas.ResultExpired || r.Code != schemas.CodeApprovalExpired {
		t.Fatalf("batch %s result %+v, want completed with the call expired", b.State, r)
	}
	if out.State != schemas.TurnCompleted || out.Results[0].Status != schemas.ResultExpired {
		t.Fatalf("outcome %+v", out)
	}
	a := h.Approval(id)
	if a.Status != schemas.ApprovalExpired || a.Decision == nil || a.Decision.Principal != "tollgate:expiry" {
		t.Fatalf("approval %s decision %+v, want expired by tollgate:expiry", a.Status, a.Decision)
	}
	evs := h.Decisions(turn)
	if len(evs) != 1 || evs[0].Status != schemas.ApprovalExpired || evs[0].ApprovalID != id {
		t.Fatalf("decided events %+v, want one announcing %s expired (the prompt is closed)", evs, id)
	}
	if _, ok := h.File(path); ok {
		t.Fatalf("%s was written although its approval expired", path)
	}
	// A decision arriving after the expiry is told so and changes nothing.
	d := h.Decide(id, schemas.OptionApprove, "alice")
	if rej := h.WaitRejection(d); rej.Code != schemas.CodeApprovalExpired {
		t.Fatalf("late decision rejected with %s, want APPROVAL_EXPIRED", rej.Code)
	}
	if a := h.Approval(id); a.Status != schemas.ApprovalExpired {
		t.Fatalf("late decision moved the approval to %s", a.Status)
	}
}

func TestAnUnansweredApprovalExpiresWithoutAnyDecision(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: expiryPolicy})
	turn := h.Send(h.Inbound("exp-1", "alice", pt.Call("write_file", `{"path":"never.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	a := h.WaitPending(id)
	if a.ExpiresAt.IsZero() || a.ExpiresAt.Sub(a.RequestedAt) != time.Second {
		t.Fatalf("expires_at %v requested_at %v, want 1s later", a.ExpiresAt, a.RequestedAt)
	}
	wantExpired(t, h, turn, id, "never.txt")
	if got := h.Metric("tollgate_decisions_total", map[string]string{"result": "expired_unanswered"}); got != 1 {
		t.Fatalf("expired_unanswered = %v, want 1", got)
	}
}

func TestAnApprovalThatExpiredWhileNoApproverRanIsExpiredOnStart(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: expiryPolicy, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
	turn := h.Send(h.Inbound("exp-2", "alice", pt.Call("write_file", `{"path":"down.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	a := h.WaitPending(id)
	jstest.Eventually(t, jstest.Wait, "the expiry to pass", func() bool { return time.Now().After(a.ExpiresAt) })
	if got := h.Approval(id).Status; got != schemas.ApprovalPending {
		t.Fatalf("with no approver running the approval is %s, want still pending", got)
	}
	// An approver starts: it finds the overdue approval in its first look
	// at the bucket and expires it.
	pt.Start(t, pt.Options{Policy: expiryPolicy, Env: h.Env, Keys: h.Keys, Stages: []string{pt.Approver}})
	wantExpired(t, h, turn, id, "down.txt")
}

func TestAnApprovalWithoutExpiryHasNone(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: expiryPolicy, Tools: []tools.Tool{&pt.Counter{ToolName: "count"}}})
	turn := h.Send(h.Inbound("exp-3", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	if a := h.WaitPending(id); !a.ExpiresAt.IsZero() {
		t.Fatalf("expires_at %v, want none (policy says \"none\")", a.ExpiresAt)
	}
}

// An expiry that failed (the compare-and-set had no answer in time, a
// broker election, say) is tried again by the tracker, which keeps the
// approval overdue until then; the expired record's revision is then the
// one decided event, which the batch was waiting for.
func TestAFailedExpiryIsTriedAgain(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: expiryPolicy, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
	turn := h.Send(h.Inbound("exp-retry", "alice", pt.Call("write_file", `{"path":"retry.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)

	var calls atomic.Int32
	reg := prometheus.NewRegistry()
	var overdueAtRetry atomic.Int64 // the gauge's value when the retry came, +1 (0: no retry yet)
	expire := func(ctx context.Context, id string) error {
		if calls.Load() == 1 {
			overdueAtRetry.Store(int64(gaugeValue(t, reg, "tollgate_approvals_overdue")) + 1)
		}
		if calls.Add(1) == 1 {
			return errors.New("update tollgate_approvals: no response from stream")
		}
		return h.Approver.Expire(ctx, id)
	}
	tr, err := approver.NewPendingTracker(h.Store.Approvals.KV, nil, expire, nil, pt.Logger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tr.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	b, _ := h.WaitTerminal(turn)
	if v := overdueAtRetry.Load() - 1; v != 1 {
		t.Fatalf("tollgate_approvals_overdue while the failed expiry waited for its retry = %v, want 1", v)
	}
	cancel()
	<-done
	if v := gaugeValue(t, reg, "tollgate_approvals_overdue"); v != 0 {
		t.Fatalf("tollgate_approvals_overdue after the retry succeeded = %v, want 0", v)
	}
	if r := b.Results[0]; r.Status != schemas.ResultExpired {
		t.Fatalf("result %+v, want expired", r)
	}
	if n := calls.Load(); n < 2 {
		t.Fatalf("expire called %d times, want a retry after the failure", n)
	}
	if evs := h.Decisions(turn); len(evs) != 1 || evs[0].Status != schemas.ApprovalExpired {
		t.Fatalf("decisions %+v, want the expiry's", evs)
	}
	if evs := h.Decided(turn); len(evs) != 0 {
		t.Fatalf("published decided events %+v, want none (the expired record's revision is the event)", evs)
	}
}

// gaugeValue reads the gauge called name from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s in %d families", name, len(mfs))
	return 0
}
