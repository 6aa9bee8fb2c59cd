package pipelinetest_test

import (
	"fmt"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const upgradePolicy = `{
  "version": "group-commit-upgrade",
  "tools": {
    "echo":    {"approval": "never"},
    "guarded": {"approval": "required"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// An upgrade to the group committer: the previous version (single writes,
// streams and buckets without allow_atomic) leaves approvals pending,
// batches waiting for them and turns queued behind them; the new version
// starts on the same server, turns allow_atomic on, and finishes every
// turn once the approvals are decided, each call run once.
//
// The policy queues a session's next turn behind its waiting batch (the
// default); upgradePolicy's supersede would abandon the waiting turns as
// soon as the queued ones arrive, before their approvals are decided.
func TestUpgradeToGroupCommitWithPendingApprovals(t *testing.T) {
	env := jstest.Start(t)
	guarded := &pt.Counter{ToolName: "guarded"}
	old := pt.Start(t, pt.Options{Env: env, Policy: upgradePolicy, Tools: []tools.Tool{guarded}, NoGroupCommit: true})
	ctx, cancel := old.Ctx()
	defer cancel()
	const sessions = 6
	var waiting, queued []string
	for i := range sessions {
		s := fmt.Sprintf("upgrade-%d", i)
		w := old.Send(old.Inbound(s, "alice", pt.Call("guarded", fmt.Sprintf(`{"n":%d}`, i))))
		old.WaitPending(schemas.ApprovalID(w, 0))
		old.WaitState(w, schemas.BatchAwaiting)
		waiting = append(waiting, w)
	}
	old.Stop()
	// The previous version's topology: no stream allows atomic batches.
	// Changed with the old stages stopped (the data they wrote stays), as
	// nats-server 2.15.2 races a stream's config update against a consumer
	// being created on it (the race detector's report: fileStore.UpdateConfig
	// against fileStore.ConsumerStore).
	for _, sc := range append(env.Topology.Streams(), env.Topology.BucketStreams()...) {
		sc.AllowAtomicPublish = false
		if _, err := env.JS.UpdateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}

	h := pt.Start(t, pt.Options{Env: env, Keys: old.Keys, Policy: upgradePolicy, Tools: []tools.Tool{guarded}})
	for _, sc := range append(env.Topology.Streams(), env.Topology.BucketStreams()...) {
		if s, err := env.JS.Stream(ctx, sc.Name); err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("%s after the new version started: %v, allow_atomic off", sc.Name, err)
		}
	}
	for i := range sessions {
		// A turn of the new version queued behind the old one's.
		queued = append(queued, h.Send(h.Inbound(fmt.Sprintf("upgrade-%d", i), "alice", pt.Call("echo", `{"text":"after"}`))))
	}
	for _, w := range waiting {
		h.Decide(schemas.ApprovalID(w, 0), schemas.OptionApprove, "alice")
	}
	for i, w := range waiting {
		if o := h.WaitOutcome(w); o.State != schemas.TurnCompleted || guarded.Runs(schemas.CallID(w, 0)) != 1 {
			t.Fatalf("turn %s ended %s (%s), its call ran %d times; results %+v", w, o.State, o.Code, guarded.Runs(schemas.CallID(w, 0)), o.Results)
		}
		if o := h.WaitOutcome(queued[i]); o.State != schemas.TurnCompleted {
			t.Fatalf("queued turn %s ended %s (%s)", queued[i], o.State, o.Code)
		}
	}
}
