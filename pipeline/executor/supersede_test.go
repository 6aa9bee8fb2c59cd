package executor_test

import (
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

func busyPolicy(mode string) string {
	return `{
  "version": "busy-` + mode + `",
  "tools": {"echo": {"approval": "never"}, "write_file": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}},
  "sessions": {"busy": "` + mode + `"}
}`
}

func TestSupersedeAbandonsTheWaitingBatchAndTheNewTurnRuns(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: busyPolicy("supersede")})
	old := h.Send(h.Inbound("busy-s", "alice", pt.Call("write_file", `{"path":"stale.txt","content":"x"}`), pt.Call("echo", `{"text":"first"}`)))
	id := schemas.ApprovalID(old, 0)
	h.WaitPending(id)

	next := h.Send(h.Inbound("busy-s", "alice", pt.Call("echo", `{"text":"second"}`)))

	b, out := h.WaitTerminal(old)
	r := b.Results[0]
	if b.State != schemas.BatchCompleted || r.Status != schemas.ResultAbandoned || r.Code != schemas.CodeTurnSuperseded {
		t.Fatalf("superseded batch %s, result %+v; want completed with the call abandoned TURN_SUPERSEDED", b.State, r)
	}
	if out.Results[1].Status != schemas.ResultOK {
		t.Fatalf("the call that ran before the wait lost its result: %+v", out.Results[1])
	}
	if a := h.Approval(id); a.Status != schemas.ApprovalAbandoned || a.Decision == nil || a.Decision.Principal != "tollgate:superseded-by:"+next {
		t.Fatalf("approval %s decision %+v", a.Status, a.Decision)
	}
	if evs := h.Decisions(old); len(evs) != 1 || evs[0].Status != schemas.ApprovalAbandoned {
		t.Fatalf("decided events %+v, want one announcing the prompt abandoned", evs)
	}
	nb, nout := h.WaitTerminal(next)
	if nb.State != schemas.BatchCompleted || nout.Results[0].Output != "second" {
		t.Fatalf("the superseding turn: %s %+v", nb.State, nout.Results)
	}
	if _, ok := h.File("stale.txt"); ok {
		t.Fatal("the superseded call ran")
	}
	// A late approval of the abandoned prompt changes nothing.
	d := h.Decide(id, schemas.OptionApprove, "alice")
	if rej := h.WaitRejection(d); rej.Code != schemas.CodeApprovalAlreadyDecided {
		t.Fatalf("late decision rejected with %s", rej.Code)
	}
	if _, ok := h.File("stale.txt"); ok {
		t.Fatal("a late decision ran the superseded call")
	}
}

func TestSupersedeDuringRedriveKeepsADecidedBatch(t *testing.T) {
	// No redriver yet: the approval is decided but the batch not redriven
	// when the new turn arrives.
	h := pt.Start(t, pt.Options{Policy: busyPolicy("supersede"), Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
	old := h.Send(h.Inbound("busy-r", "alice", pt.Call("write_file", `{"path":"kept.txt","content":"x"}`)))
	id := schemas.ApprovalID(old, 0)
	h.WaitPending(id)
	h.Decide(id, schemas.OptionApprove, "alice")
	h.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })

	next := h.Send(h.Inbound("busy-r", "alice", pt.Call("echo", `{"text":"after"}`)))
	h.WaitState(next, schemas.BatchQueued)
	h.WaitIdle(pt.Executor) // its handler, supersede check included, has finished
	if a := h.Approval(id); a.Status != schemas.ApprovalApproved {
		t.Fatalf("supersede changed a decided approval to %s", a.Status)
	}

	r := pt.Start(t, pt.Options{Policy: busyPolicy("supersede"), Env: h.Env, Keys: h.Keys, Stages: []string{pt.Redriver}})
	b, _ := h.WaitTerminal(old)
	if r := b.Results[0]; r.Status != schemas.ResultOK {
		t.Fatalf("the approved call of the superseded-too-late batch: %+v, want it run", r)
	}
	if c, ok := r.File("kept.txt"); !ok || c != "x" { // the redriver's sandbox
		t.Fatal("approved call did not run")
	}
	if nb, _ := h.WaitTerminal(next); nb.State != schemas.BatchCompleted {
		t.Fatalf("new turn %s", nb.State)
	}
}

func TestQueueIsTheDefaultBusyPolicy(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: busyPolicy("queue")})
	old := h.Send(h.Inbound("busy-q", "alice", pt.Call("write_file", `{"path":"q.txt","content":"x"}`)))
	id := schemas.ApprovalID(old, 0)
	h.WaitPending(id)
	next := h.Send(h.Inbound("busy-q", "alice", pt.Call("echo", `{"text":"waits"}`)))
	h.WaitState(next, schemas.BatchQueued)
	h.WaitIdle(pt.Executor) // its handler, supersede check included, has finished
	if a := h.Approval(id); a.Status != schemas.ApprovalPending {
		t.Fatalf("queue policy changed the waiting approval to %s", a.Status)
	}
	h.Decide(id, schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(next); b.State != schemas.BatchCompleted {
		t.Fatalf("queued turn %s", b.State)
	}
	if _, ok := h.File("q.txt"); !ok {
		t.Fatal("the approved call did not run")
	}
}
