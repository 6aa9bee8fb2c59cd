package web_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// withoutApprover are the stages a test runs when it runs its own approver.
var withoutApprover = []string{pipelinetest.Ingest, pipelinetest.Executor, pipelinetest.Redriver}

// inboxTools are the tools startInbox registers.
func inboxTools() (count, files *pipelinetest.Counter, all []tools.Tool) {
	count, files = &pipelinetest.Counter{}, &pipelinetest.Counter{ToolName: "files"}
	return count, files, []tools.Tool{count, &pipelinetest.Counter{ToolName: "quick"}, &pipelinetest.Counter{ToolName: "vault"}, &pipelinetest.Counter{ToolName: "pair"}, files}
}

// startInboxStages is startInbox running only stages of the pipeline.
func startInboxStages(t *testing.T, stages []string) *inbox {
	t.Helper()
	count, files, all := inboxTools()
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy, Tools: all, Stages: stages})
	c := &clock{}
	srv := startGateway(t, h, c, nil)
	return &inbox{H: h, t: t, url: srv.URL, srv: srv, clock: c, count: count, files: files}
}

// startApprover runs the pipeline's approver stage on in's server.
func (in *inbox) startApprover(t *testing.T) {
	t.Helper()
	_, _, all := inboxTools()
	pipelinetest.Start(t, pipelinetest.Options{Env: in.Env, Keys: in.Keys, Policy: testPolicy, Tools: all, Stages: []string{pipelinetest.Approver}})
}

// TestADecisionIsAnsweredByTheRecordWithoutADecidedEvent: the approver
// publishes no approval.decided event for a decision it applies (only for
// a repeat, with Repeat set: issue 36). Alice's approve is answered
// applied, from the approval record; bob's approve after it, a repeat
// that changes no record, is answered applied by the approver's
// announcement; bob's deny is rejected APPROVAL_ALREADY_DECIDED. On a
// quorum of two, dave's approve is answered as a vote and alice's,
// completing the quorum, as applied.
func TestADecisionIsAnsweredByTheRecordWithoutADecidedEvent(t *testing.T) {
	in := startInboxStages(t, withoutApprover)
	in.H.RunApprover()
	alice, bob, dave := in.browser(), in.browser(), in.browser()
	alice.signIn("alice")
	bob.signIn("bob")
	dave.signIn("dave")
	verdict := func(who string, b *browser, a *schemas.ApprovalRecord, option string, status int, want string) {
		t.Helper()
		resp, card := b.decide(a.ApprovalID, option, a.ArgsDigest)
		if resp.StatusCode != status || resp.Header.Get("Tollgate-Verdict") != want {
			t.Fatalf("%s's %s: %d %q, want %d %q\n%s", who, option, resp.StatusCode, resp.Header.Get("Tollgate-Verdict"), status, want, card)
		}
	}

	a := in.request("carol", "count", `{"n":1}`, true)
	verdict("alice", alice, a, "approve", http.StatusOK, web.VerdictApplied)
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalApproved || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v, want approved by web:alice", rec.Status, rec.Decision)
	}
	verdict("bob", bob, a, "approve", http.StatusOK, web.VerdictApplied)
	verdict("bob", bob, a, "deny", http.StatusConflict, web.VerdictRejected)
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalApproved || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v after the repeat, want approved by web:alice", rec.Status, rec.Decision)
	}

	p := in.request("carol", "pair", `{"n":1}`, true)
	verdict("dave", dave, p, "approve", http.StatusOK, web.VerdictVote)
	verdict("alice", alice, p, "approve", http.StatusOK, web.VerdictApplied)
	if rec := in.Approval(p.ApprovalID); rec.Status != schemas.ApprovalApproved || len(rec.Votes) != 2 {
		t.Fatalf("approval %s with votes %+v, want approved by two", rec.Status, rec.Votes)
	}
	for _, turn := range []string{a.TurnID, p.TurnID} {
		for _, ev := range in.Decided(turn) {
			if ev.Repeat == "" {
				t.Fatalf("an approval.decided event without Repeat was published: %+v", ev)
			}
		}
	}
}

// TestADecisionIsNotAnsweredByAWriteNeverStored: a core subscription to
// the approval record's subject hears every write sent there, a
// compare-and-set that lost included, which the bucket never stores.
// While alice's approve waits, such a write arrives holding the approval
// approved by her; then bob's deny, stored before her approve, is
// applied. Her verdict is the approver's rejection (409
// APPROVAL_ALREADY_DECIDED), never applied.
func TestADecisionIsNotAnsweredByAWriteNeverStored(t *testing.T) {
	for _, tc := range []struct {
		name        string
		repeatsOnly bool
	}{{"the approver as a pipeline stage", false}, {"the approver run on its own", true}} {
		t.Run(tc.name, func(t *testing.T) {
			in := startInboxStages(t, withoutApprover)
			alice := in.browser()
			alice.signIn("alice")
			a := in.request("carol", "count", `{"n":1}`, true)
			deny := in.Decision(a.ApprovalID, "deny", web.Transport, "bob")
			in.Submit(deny)

			type answer struct {
				resp *http.Response
				card string
			}
			done := make(chan answer, 1)
			go func() {
				resp, card := alice.decide(a.ApprovalID, "approve", a.ArgsDigest)
				done <- answer{resp, card}
			}()
			jstest.Eventually(t, pipelinetest.Wait, "alice's approve stored after bob's deny", func() bool {
				return in.webDecisions(a.ApprovalID) == 2
			})
			in.ForgeLostWrite(a, schemas.ApprovalApproved,
				&schemas.DecisionInfo{DecisionID: "d-lost", Principal: "web:alice", Option: "approve", DecidedAt: time.Now().UTC()})
			if tc.repeatsOnly {
				in.H.RunApprover()
			} else {
				in.startApprover(t)
			}

			got := <-done
			if got.resp.StatusCode != http.StatusConflict || got.resp.Header.Get("Tollgate-Verdict") != web.VerdictRejected ||
				got.resp.Header.Get("Tollgate-Code") != string(schemas.CodeApprovalAlreadyDecided) {
				t.Fatalf("alice's approve: %d %q %q, want 409 rejected %s\n%s", got.resp.StatusCode, got.resp.Header.Get("Tollgate-Verdict"),
					got.resp.Header.Get("Tollgate-Code"), schemas.CodeApprovalAlreadyDecided, got.card)
			}
			if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalDenied || rec.Decision.DecisionID != deny.DecisionID {
				t.Fatalf("approval %s by %+v, want denied by %s", rec.Status, rec.Decision, deny.DecisionID)
			}
		})
	}
}
