package web_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
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

// repeatsOnly is JetStream as the approver publishes through it once
// approval.decided is only its answer to a decision that changed no record
// (issue 36): a decided event without Repeat is acknowledged and dropped,
// so that a decision's only trace is the revision of its approval record.
type repeatsOnly struct{ jetstream.JetStream }

func (j repeatsOnly) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.HasPrefix(m.Subject, topology.SubjectApprovalDecided) {
		if ev, err := schemas.Decode[schemas.DecidedEvent](m.Data); err == nil && ev.Repeat == "" {
			return &jetstream.PubAck{Stream: topology.StreamEvents}, nil
		}
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// runRepeatsOnlyApprover runs the approver stage on h's pipeline (started
// without its own), publishing through repeatsOnly, until the test ends.
func runRepeatsOnlyApprover(t *testing.T, h *pipelinetest.H) {
	t.Helper()
	a, err := approver.New(approver.Config{
		JS: repeatsOnly{h.JS}, Store: h.Store, Policy: h.Policy, Keys: h.Keys,
		Logger: pipelinetest.Logger(), Metrics: runner.NewMetrics(nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("approver: %v", err)
		}
	})
}

// forgeLostWrite sends to approval rec's subject the write of a
// compare-and-set that lost: rec decided by decision, expecting a
// revision that is not the record's last. The bucket refuses it (the test
// checks), and the record stays as it was; a core subscriber hears it.
func forgeLostWrite(t *testing.T, h *pipelinetest.H, rec *schemas.ApprovalRecord, status schemas.ApprovalStatus, decision *schemas.DecisionInfo) {
	t.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	_, rev, err := h.Store.Approvals.Get(ctx, rec.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	lost := *rec
	lost.Status, lost.Decision = status, decision
	data, err := schemas.Encode(&lost)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(topology.ApprovalRevisionSubject(rec.ApprovalID))
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev-1, 10))
	if _, err := h.JS.PublishMsg(ctx, m); err == nil {
		t.Fatal("the bucket stored a write expecting a revision not its last")
	}
	if now := h.Approval(rec.ApprovalID); now.Status != schemas.ApprovalPending {
		t.Fatalf("approval %s after the lost write, want pending", now.Status)
	}
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
	runRepeatsOnlyApprover(t, in.H)
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
	}{{"with the decided events", false}, {"without them", true}} {
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
			forgeLostWrite(t, in.H, a, schemas.ApprovalApproved,
				&schemas.DecisionInfo{DecisionID: "d-lost", Principal: "web:alice", Option: "approve", DecidedAt: time.Now().UTC()})
			if tc.repeatsOnly {
				runRepeatsOnlyApprover(t, in.H)
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
