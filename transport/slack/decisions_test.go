package slack_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/schemas"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// An approval decided while its prompt is being posted (the decision is
// recorded, and handled, before Slack answers chat.postMessage: it finds
// no prompt to close) still has its prompt closed, once, in place. The
// decision is kept only in the approvals bucket: no approval.decided is
// published.
func TestADecisionWhileThePromptIsPostedClosesIt(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000300.000100"
	turn := turnOf(ch, ts)
	approval := schemas.ApprovalID(turn, 0)

	var (
		once    sync.Once
		hookErr error
	)
	r.slack.beforeAnswer("chat.postMessage", func(c call) {
		if !strings.Contains(c.form.Get("blocks"), approval) {
			return
		}
		once.Do(func() { hookErr = decideAndWait(r, approval) })
	})
	if resp := r.event(t, "Ev-race", dm("U1", ch, ts, "write race.txt")); resp.StatusCode != 200 {
		t.Fatalf("event: %d", resp.StatusCode)
	}
	prompt := r.promptOf(t, approval)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	update := r.slack.await(t, 1, "chat.update", in(ch))[0]
	if update.form.Get("ts") != prompt.ts || !strings.Contains(update.form.Get("blocks"), "Approved") {
		t.Errorf("chat.update of %q: %s; want the prompt %q closed, approved", update.form.Get("ts"), update.form.Get("blocks"), prompt.ts)
	}
	r.awaitConsumed(t)
	if n := len(r.slack.find("chat.update", nil)); n != 1 {
		t.Errorf("%d chat.update calls, want 1", n)
	}
	if n := len(r.h.Decided(turn)); n != 0 {
		t.Fatalf("%d approval.decided events published; this test decides in the bucket alone", n)
	}
}

// decideAndWait approves approval id in the approvals bucket as the
// approver does (a compare-and-set of the pending record), publishing
// nothing, and returns once the transport's decisions consumer has handled
// that revision.
func decideAndWait(r *rig, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Wait)
	defer cancel()
	_, rev, err := r.h.Store.Approvals.Mutate(ctx, id, func(a *schemas.ApprovalRecord) error {
		a.Status = schemas.ApprovalApproved
		a.Decision = &schemas.DecisionInfo{DecisionID: "d-race", Principal: "slack:T1:U1", Option: schemas.OptionApprove, DecidedAt: time.Now().UTC()}
		return nil
	})
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		c, err := r.h.JS.Consumer(ctx, topology.StreamApprovals, decisions.Durable(tgslack.Durable))
		if err == nil && c.CachedInfo().AckFloor.Stream >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("the decisions consumer did not pass revision %d of %s", rev, id)
}
