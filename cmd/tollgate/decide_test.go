package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// cliPolicy gates count; on the cli transport the requester decides.
const cliPolicy = `{"version": "cli-race-1", "default_approval": "required", "tools": {"count": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}}`

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
			h := pt.Start(t, pt.Options{Policy: cliPolicy, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
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
				return len(h.SentDecisions("cli", id)) == 2
			})
			pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: cliPolicy, Tools: []tools.Tool{count}, Stages: []string{pt.Approver}})

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

// cliDecisions are the decisions the cli transport sent on approval id,
// in order (pt.H.SentDecisions).
func cliDecisions(h *pt.H, id string) []*schemas.Decision {
	return h.SentDecisions("cli", id)
}

// TestDecideIsAnsweredByTheRecordWithoutADecidedEvent: the approver
// publishes no approval.decided event for a decision it applies (only for
// a repeat, with Repeat set). `tollgate approve --json` is answered by
// the approval record's revision: exit 0, and the decided event it prints
// is the record's, byte for byte as the approver used to publish it
// (schemas.DecidedOf), naming the command's own decision. The same
// person's approve again is a repeat, answered by the approver's
// announcement (Repeat: its decision id) with the decision recorded first;
// a deny after it is rejected APPROVAL_ALREADY_DECIDED.
func TestDecideIsAnsweredByTheRecordWithoutADecidedEvent(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: cliPolicy, Tools: []tools.Tool{&pt.Counter{}}, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
	h.RunApprover()
	turn := h.Send(h.Inbound("s-cli-record", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	url := "--nats=" + h.Env.URL()

	code, out, errOut := runCLI(t, "approve", id, "--as", "alice", "--json", url)
	rec := h.Approval(id)
	mine := cliDecisions(h, id)
	if code != 0 || len(mine) != 1 || rec.Status != schemas.ApprovalApproved || rec.Decision == nil || rec.Decision.DecisionID != mine[0].DecisionID {
		t.Fatalf("approve: exit %d, stdout %q, stderr %q; record %s by %+v", code, out, errOut, rec.Status, rec.Decision)
	}
	data, err := schemas.Encode(schemas.DecidedOf(rec))
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	wantJSON, _ := json.Marshal(asMap(data))
	if json.Unmarshal([]byte(out), &got) != nil || json.Unmarshal(wantJSON, &want) != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("approve printed %s, want the record's decided event %s", out, wantJSON)
	}
	for _, ev := range h.Decided(turn) {
		if ev.Repeat == "" {
			t.Fatalf("an approval.decided event without Repeat was published: %+v", ev)
		}
	}

	code, out, errOut = runCLI(t, "approve", id, "--as", "alice", "--json", url)
	mine = cliDecisions(h, id)
	var repeat map[string]any
	if code != 0 || len(mine) != 2 || json.Unmarshal([]byte(out), &repeat) != nil {
		t.Fatalf("approve again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	first, _ := repeat["decision"].(map[string]any)
	if repeat["status"] != string(schemas.ApprovalApproved) || repeat["repeat"] != mine[1].DecisionID || first["decision_id"] != mine[0].DecisionID {
		t.Fatalf("approve again printed %s: want approved, repeat %s, the decision recorded %s", out, mine[1].DecisionID, mine[0].DecisionID)
	}

	code, out, errOut = runCLI(t, "deny", id, "--as", "alice", url)
	if code != 1 || out != "" || !strings.Contains(errOut, string(schemas.CodeApprovalAlreadyDecided)) {
		t.Fatalf("deny after approve: exit %d, stdout %q, stderr %q; want exit 1 rejected %s", code, out, errOut, schemas.CodeApprovalAlreadyDecided)
	}
}

// TestDecideIsNotAnsweredByAWriteNeverStored: a core subscription to the
// approval record's subject hears every write sent there, a
// compare-and-set that lost included, which the bucket never stores.
// While `tollgate approve` waits, such a write arrives holding the
// approval approved by the command's own principal and option (an answer
// to its decision, were it stored); then the deny stored before the
// approve is applied. The command answers the approver's rejection of its
// approve (exit 1, APPROVAL_ALREADY_DECIDED), never "approved".
func TestDecideIsNotAnsweredByAWriteNeverStored(t *testing.T) {
	for _, tc := range []struct {
		name       string
		repeatOnly bool
	}{{"the approver as a pipeline stage", false}, {"the approver run on its own", true}} {
		t.Run(tc.name, func(t *testing.T) {
			count := &pt.Counter{}
			h := pt.Start(t, pt.Options{Policy: cliPolicy, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor, pt.Redriver}})
			turn := h.Send(h.Inbound("s-cli-lost", "alice", pt.Call("count", `{}`)))
			id := schemas.ApprovalID(turn, 0)
			pending := h.WaitPending(id)
			deny := h.Decide(id, "deny", "alice")

			type result struct {
				code        int
				out, errOut string
			}
			done := make(chan result, 1)
			go func() {
				code, out, errOut := runCLI(t, "approve", id, "--as", "alice", "--nats="+h.Env.URL())
				done <- result{code, out, errOut}
			}()
			jstest.Eventually(t, pt.Wait, "the command's approve stored after the deny", func() bool {
				return len(cliDecisions(h, id)) == 2
			})
			h.ForgeLostWrite(pending, schemas.ApprovalApproved, &schemas.DecisionInfo{DecisionID: "d-lost", Principal: "cli:alice", Option: "approve", DecidedAt: time.Now().UTC()})
			if tc.repeatOnly {
				h.RunApprover()
			} else {
				pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: cliPolicy, Tools: []tools.Tool{count}, Stages: []string{pt.Approver}})
			}

			r := <-done
			if r.code != 1 || r.out != "" || !strings.Contains(r.errOut, string(schemas.CodeApprovalAlreadyDecided)) {
				t.Fatalf("approve: exit %d, stdout %q, stderr %q; want exit 1 rejected %s", r.code, r.out, r.errOut, schemas.CodeApprovalAlreadyDecided)
			}
			if a := h.Approval(id); a.Status != schemas.ApprovalDenied || a.Decision.DecisionID != deny.DecisionID {
				t.Fatalf("approval %s by %+v, want denied by %s", a.Status, a.Decision, deny.DecisionID)
			}
		})
	}
}
