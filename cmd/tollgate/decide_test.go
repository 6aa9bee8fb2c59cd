package main

import (
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// TestDecideAnswersOnlyItsOwnDecision: `tollgate approve` loses the race
// to a deny sent just before it (both are stored before the approver
// starts, the deny first). The approval's decided event names the deny;
// the command does not report it as its own verdict but waits for the
// approver's answer to its decision: rejected APPROVAL_ALREADY_DECIDED,
// exit status 1, in text and in JSON.
func TestDecideAnswersOnlyItsOwnDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		json bool
	}{{"in text", false}, {"in JSON", true}} {
		t.Run(tc.name, func(t *testing.T) {
			count := &pt.Counter{}
			policy := `{"version": "cli-race-1", "default_approval": "required", "tools": {"count": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}}`
			h := pt.Start(t, pt.Options{Policy: policy, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
			turn := h.Send(h.Inbound("s-cli-race", "alice", pt.Call("count", `{}`)))
			id := schemas.ApprovalID(turn, 0)
			h.WaitPending(id)

			deny := h.Decide(id, "deny", "alice")
			args := []string{"approve", id, "--as", "alice", "--nats=" + h.Env.URL()}
			if tc.json {
				args = append(args, "--json")
			}
			type result struct {
				code        int
				out, errOut string
			}
			done := make(chan result, 1)
			go func() {
				code, out, errOut := runCLI(t, args...)
				done <- result{code, out, errOut}
			}()
			jstest.Eventually(t, pt.Wait, "the command's approve stored after the deny", func() bool {
				return len(h.Messages(topology.StreamDecisions, topology.DecisionSubject("cli", id))) == 2
			})
			pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policy, Tools: []tools.Tool{count}, Stages: []string{pt.Approver}})

			r := <-done
			if a := h.Approval(id); a.Status != schemas.ApprovalDenied || a.Decision.DecisionID != deny.DecisionID {
				t.Fatalf("approval %s by %+v, want denied by %s", a.Status, a.Decision, deny.DecisionID)
			}
			// The rejection, not the deny's decided event (its status).
			got, foreign := r.errOut, r.out != ""
			if tc.json {
				got, foreign = r.out, strings.Contains(r.out, `"status"`)
			}
			if r.code != 1 || !strings.Contains(got, string(schemas.CodeApprovalAlreadyDecided)) || foreign {
				t.Fatalf("approve: exit %d, stdout %q, stderr %q; want exit 1 rejected %s", r.code, r.out, r.errOut, schemas.CodeApprovalAlreadyDecided)
			}
		})
	}
}
