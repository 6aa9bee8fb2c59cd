package approver_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// testPolicy: write_file needs approval from the requester, cli:bob (global
// approver) or cli:carol (write_file approver); "count" offers only approve.
const testPolicy = `{
  "version": "approver-test",
  "approvers": ["cli:bob"],
  "tools": {
    "echo":       {"approval": "never"},
    "write_file": {"approval": "required", "approvers": ["cli:carol"]},
    "count":      {"approval": "required", "options": ["approve"]},
    "other":      {"approval": "required", "approvers": ["cli:dave"]}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// pendingWrite sends a turn whose only call is a write_file of path by alice
// and waits for its approval to be pending.
func pendingWrite(h *pt.H, session, path string) (turn, approvalID string) {
	h.T.Helper()
	turn = h.Send(h.Inbound(session, "alice", pt.Call("write_file", fmt.Sprintf(`{"path":%q,"content":"approved"}`, path))))
	approvalID = schemas.ApprovalID(turn, 0)
	h.WaitPending(approvalID)
	return turn, approvalID
}

func TestRejectedDecisionsArePublishedWithACodeAndRunNothing(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}})

	type setup struct {
		decision   *schemas.Decision
		turn       string // "" if there is no batch
		file       string // the write the approval is for
		wantStatus schemas.ApprovalStatus
		wantFile   bool
	}
	tests := []struct {
		name    string
		code    schemas.Code
		prepare func(h *pt.H, session string) setup
	}{
		{"an approval that does not exist", schemas.CodeApprovalNotFound, func(h *pt.H, _ string) setup {
			return setup{decision: h.Decision(schemas.ApprovalID("t-00000000000000000000", 0), schemas.OptionApprove, "cli", "alice")}
		}},
		{"an approval id that is not a valid key", schemas.CodeApprovalNotFound, func(h *pt.H, _ string) setup {
			return setup{decision: h.Decision("a.b", schemas.OptionApprove, "cli", "alice")}
		}},
		{"another principal on the same transport", schemas.CodeDeciderNotAuthorized, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			return setup{decision: h.Decision(id, schemas.OptionApprove, "cli", "mallory"), turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"the requester's sender id on a different transport", schemas.CodeDeciderNotAuthorized, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			return setup{decision: h.Decision(id, schemas.OptionApprove, "slack", "alice"), turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"an approver named for a different tool", schemas.CodeDeciderNotAuthorized, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			return setup{decision: h.Decision(id, schemas.OptionApprove, "cli", "dave"), turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"an unverified sender claiming the requester's id", schemas.CodeDeciderNotAuthorized, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
			d.Decider.Verified = false
			return setup{decision: d, turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"a bot with the requester's id", schemas.CodeDeciderNotAuthorized, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
			d.Decider.Kind = schemas.SenderBot
			return setup{decision: d, turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"a digest of other arguments", schemas.CodeArgsDigestMismatch, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
			_, d.ArgsDigest, _ = schemas.CanonicalArgs(`{"content":"approved","path":"../../etc/passwd"}`)
			return setup{decision: d, turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"an option the prompt did not offer", schemas.CodeOptionNotOffered, func(h *pt.H, s string) setup {
			turn := h.Send(h.Inbound(s, "alice", pt.Call("count", `{}`)))
			id := schemas.ApprovalID(turn, 0)
			if a := h.WaitPending(id); len(a.Options) != 1 || a.Options[0] != schemas.OptionApprove {
				h.T.Fatalf("options %v, want [approve]", a.Options)
			}
			return setup{decision: h.Decision(id, schemas.OptionDeny, "cli", "alice"), turn: turn, wantStatus: schemas.ApprovalPending}
		}},
		{"an option that does not exist", schemas.CodeOptionNotOffered, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			return setup{decision: h.Decision(id, "maybe", "cli", "alice"), turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalPending}
		}},
		{"a deny after an approve", schemas.CodeApprovalAlreadyDecided, func(h *pt.H, s string) setup {
			turn, id := pendingWrite(h, s, s+".txt")
			h.Decide(id, schemas.OptionApprove, "alice")
			h.WaitTerminal(turn)
			return setup{decision: h.Decision(id, schemas.OptionDeny, "cli", "bob"), turn: turn, file: s + ".txt", wantStatus: schemas.ApprovalApproved, wantFile: true}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			s := tc.prepare(h, fmt.Sprintf("rej%d", i))
			d := s.decision
			h.Submit(d)
			rej := h.WaitRejection(d)
			if rej.Code != tc.code || rej.ApprovalID != d.ApprovalID || rej.Principal != schemas.Principal(d.Transport, d.Decider.ID) {
				t.Fatalf("rejection %+v, want code %s for %s", rej, tc.code, d.ApprovalID)
			}
			if s.turn == "" {
				return
			}
			if a := h.Approval(d.ApprovalID); a.Status != s.wantStatus {
				t.Fatalf("approval is %s after a rejected decision, want %s", a.Status, s.wantStatus)
			}
			if s.wantStatus == schemas.ApprovalPending {
				// The rejected decision changed nothing: the requester's own
				// approve still applies, and the tool runs exactly once.
				h.Decide(d.ApprovalID, schemas.OptionApprove, "alice")
			}
			b, _ := h.WaitTerminal(s.turn)
			if r := b.Results[0]; r.Status != schemas.ResultOK {
				t.Fatalf("result %+v, want ok after the requester's approval", r)
			}
			if s.file != "" {
				if c, ok := h.File(s.file); !ok || c != "approved" {
					t.Fatalf("file %s: exists=%v %q", s.file, ok, c)
				}
			}
			for _, ev := range h.Decisions(s.turn) {
				if ev.Decision != nil && ev.Decision.DecisionID == d.DecisionID {
					t.Fatalf("rejected decision %s produced a decided event", d.DecisionID)
				}
			}
		})
	}
	if n := count.Total(); n != 1 {
		t.Fatalf("count ran %d times, want once (the requester's approval)", n)
	}
}

func TestRejectedDecisionLeavesNoSideEffectBeforeTheRealOne(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	tests := []struct {
		name   string
		mangle func(d *schemas.Decision)
		code   schemas.Code
	}{
		{"another principal", func(d *schemas.Decision) { d.Decider.ID = "mallory" }, schemas.CodeDeciderNotAuthorized},
		{"the requester's id on another transport", func(d *schemas.Decision) { d.Transport = "slack" }, schemas.CodeDeciderNotAuthorized},
		{"a digest of other arguments", func(d *schemas.Decision) { d.ArgsDigest = schemas.ArgsDigest(`{}`) }, schemas.CodeArgsDigestMismatch},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			session := fmt.Sprintf("noside%d", i)
			turn, id := pendingWrite(h, session, session+".txt")
			d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
			tc.mangle(d)
			h.Submit(d)
			if rej := h.WaitRejection(d); rej.Code != tc.code {
				t.Fatalf("code %s, want %s", rej.Code, tc.code)
			}
			// The batch is still awaiting and nothing was written: the
			// rejection (already stored) proves the decision was handled.
			if b := h.Batch(turn); b.State != schemas.BatchAwaiting {
				t.Fatalf("batch %s after a rejected decision", b.State)
			}
			if _, ok := h.File(session + ".txt"); ok {
				t.Fatal("file written on a rejected decision")
			}
		})
	}
}

func TestRepeatedIdenticalApproveIsAnIdempotentSuccess(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: `{
	  "tools": {"count": {"approval": "required"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("idem", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)

	first := h.Decide(id, schemas.OptionApprove, "alice")
	h.WaitTerminal(turn)
	second := h.Decision(id, schemas.OptionApprove, "cli", "alice")
	h.Submit(second)
	third := h.Decision(id, schemas.OptionApprove, "cli", "alice")
	seq := h.Submit(third)
	h.WaitConsumed(pt.Approver, seq)
	h.WaitIdle(pt.Redriver)

	// The applied decision is its record's revision and is published
	// nowhere; each repeat, which changed no record, is answered with a
	// decided event of its own (both stored: one message id each), the
	// recorded decision with Repeat naming it.
	published := h.Decided(turn)
	if len(published) != 2 {
		t.Fatalf("published decided events %+v, want one answer per repeat", published)
	}
	for i, d := range []*schemas.Decision{second, third} {
		ev := published[i]
		if ev.Repeat != d.DecisionID || ev.Decision == nil || ev.Decision.DecisionID != first.DecisionID || !ev.Answers(d) {
			t.Fatalf("answer %d: %+v, want the recorded decision %s answering %s", i, ev, first.DecisionID, d.DecisionID)
		}
	}

	if rej := h.Rejections(id); len(rej) != 0 {
		t.Fatalf("identical repeat rejected: %+v", rej[0])
	}
	if evs := h.Decisions(turn); len(evs) != 1 || evs[0].Status != schemas.ApprovalApproved {
		t.Fatalf("decided events %+v, want exactly one approved", evs)
	}
	if a := h.Approval(id); a.Status != schemas.ApprovalApproved || a.Decision.DecisionID != first.DecisionID {
		t.Fatalf("record %s decided by %+v, want approved by the first decision", a.Status, a.Decision)
	}
	if n := count.Total(); n != 1 {
		t.Fatalf("tool ran %d times, want 1", n)
	}
	if got := h.Metric("tollgate_decisions_total", map[string]string{"result": "applied"}); got != 1 {
		t.Fatalf("applied decisions %v, want 1", got)
	}
	if got := h.Metric("tollgate_decisions_total", map[string]string{"result": "idempotent"}); got != 2 {
		t.Fatalf("idempotent decisions %v, want 2", got)
	}
}

func TestNamedApproversMayDecide(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	tests := []struct {
		name    string
		decider string
		option  string
		want    schemas.ResultStatus
		file    bool
	}{
		{"the requester approves", "alice", schemas.OptionApprove, schemas.ResultOK, true},
		{"a global approver approves", "bob", schemas.OptionApprove, schemas.ResultOK, true},
		{"the tool's own approver denies", "carol", schemas.OptionDeny, schemas.ResultDenied, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			session := fmt.Sprintf("named%d", i)
			turn, id := pendingWrite(h, session, session+".txt")
			h.Decide(id, tc.option, tc.decider)
			b, _ := h.WaitTerminal(turn)
			if r := b.Results[0]; r.Status != tc.want {
				t.Fatalf("result %+v, want %s", r, tc.want)
			}
			if a := h.Approval(id); a.Decision.Principal != "cli:"+tc.decider {
				t.Fatalf("decided by %s", a.Decision.Principal)
			}
			if _, ok := h.File(session + ".txt"); ok != tc.file {
				t.Fatalf("file exists=%v, want %v", ok, tc.file)
			}
			if rej := h.Rejections(id); len(rej) != 0 {
				t.Fatalf("rejections %+v", rej)
			}
		})
	}
}

func TestExpiredApprovalIsRejectedAndTheBatchProceeds(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: `{
	  "tools": {"write_file": {"approval": "required", "expires_after": "1ms"}, "echo": {"approval": "never"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`})
	turn := h.Send(h.Inbound("expiry", "alice",
		pt.Call("write_file", `{"path":"late.txt","content":"x"}`), pt.Call("echo", `{"text":"on time"}`)))
	id := schemas.ApprovalID(turn, 0)
	// The expiry sweep may expire it before we look: wait for the record.
	var a *schemas.ApprovalRecord
	jstest.Eventually(t, jstest.Wait, "approval "+id+" recorded", func() bool { a = h.Approval(id); return a != nil })
	if got := a.ExpiresAt.Sub(a.RequestedAt); got.Milliseconds() != 1 {
		t.Fatalf("expires %v after the request, want 1ms", got)
	}

	d := h.Decide(id, schemas.OptionApprove, "alice")
	if rej := h.WaitRejection(d); rej.Code != schemas.CodeApprovalExpired {
		t.Fatalf("rejection %s, want APPROVAL_EXPIRED", rej.Code)
	}
	b, out := h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultExpired || r.Code != schemas.CodeApprovalExpired {
		t.Fatalf("result %+v, want expired APPROVAL_EXPIRED", r)
	}
	if r := b.Results[1]; r.Status != schemas.ResultOK {
		t.Fatalf("echo %+v", r)
	}
	if out.State != schemas.TurnCompleted {
		t.Fatalf("outcome %s", out.State)
	}
	if a := h.Approval(id); a.Status != schemas.ApprovalExpired {
		t.Fatalf("approval %s, want expired", a.Status)
	}
	if _, ok := h.File("late.txt"); ok {
		t.Fatal("expired approval wrote the file")
	}
	// A later deny is also told it expired.
	d2 := h.Decide(id, schemas.OptionDeny, "alice")
	if rej := h.WaitRejection(d2); rej.Code != schemas.CodeApprovalExpired {
		t.Fatalf("second rejection %s, want APPROVAL_EXPIRED", rej.Code)
	}
}

func TestConcurrentConflictingDecisionsApplyExactlyOne(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	// A second approver worker on the same durable consumer.
	h2 := pt.Start(t, pt.Options{Policy: testPolicy, Env: h.Env, Stages: []string{pt.Approver}})

	type submitter func(d *schemas.Decision) error
	tests := []struct {
		name   string
		submit submitter
	}{
		{"decisions through the stream to two approver workers", func(d *schemas.Decision) error {
			data, err := schemas.Encode(d)
			if err != nil {
				return err
			}
			ctx, cancel := h.Ctx()
			defer cancel()
			_, err = h.JS.Publish(ctx, topology.DecisionSubject(d.Transport, d.ApprovalID), data, jetstream.WithMsgID(d.DecisionID))
			return err
		}},
		{"direct Apply calls racing on compare-and-set", func(d *schemas.Decision) error {
			ctx, cancel := h.Ctx()
			defer cancel()
			a := h.Approver
			if d.DecisionID[len(d.DecisionID)-1]%2 == 0 {
				a = h2.Approver
			}
			return a.Apply(ctx, d)
		}},
	}
	const n = 12
	for ti, tc := range tests {
		for round := range 3 {
			t.Run(fmt.Sprintf("%s round %d", tc.name, round), func(t *testing.T) {
				h := h.For(t)
				session := fmt.Sprintf("race%d-%d", ti, round)
				turn, id := pendingWrite(h, session, session+".txt")
				decisions := make([]*schemas.Decision, n)
				for i := range decisions {
					opt, who := schemas.OptionApprove, "alice"
					if i%2 == 1 {
						opt, who = schemas.OptionDeny, "bob"
					}
					decisions[i] = h.Decision(id, opt, "cli", who)
				}
				start := make(chan struct{})
				var wg sync.WaitGroup
				for _, d := range decisions {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						if err := tc.submit(d); err != nil {
							t.Errorf("apply %s: %v", d.DecisionID, err)
						}
					}()
				}
				close(start)
				wg.Wait()

				b, _ := h.WaitTerminal(turn)
				a := h.Approval(id)
				if !a.Status.Decided() || a.Decision == nil {
					t.Fatalf("approval %s", a.Status)
				}
				var winner *schemas.Decision
				for _, d := range decisions {
					if d.DecisionID == a.Decision.DecisionID {
						winner = d
					}
				}
				if winner == nil {
					t.Fatalf("record decided by unknown decision %+v", a.Decision)
				}
				// Every loser is answered: a conflicting option is rejected
				// with APPROVAL_ALREADY_DECIDED, the same option is an
				// idempotent success (no rejection).
				wantRejected := 0
				for _, d := range decisions {
					if d.Option != winner.Option {
						wantRejected++
					}
				}
				var rejs []*schemas.DecisionRejected
				jstest.Eventually(t, pt.Wait, fmt.Sprintf("%d rejections", wantRejected), func() bool {
					rejs = h.Rejections(id)
					return len(rejs) >= wantRejected
				})
				h.WaitIdle(pt.Approver, pt.Redriver)
				rejs = h.Rejections(id)
				if len(rejs) != wantRejected {
					t.Fatalf("%d rejections, want %d", len(rejs), wantRejected)
				}
				byID := map[string]*schemas.Decision{}
				for _, d := range decisions {
					byID[d.DecisionID] = d
				}
				for _, r := range rejs {
					if r.Code != schemas.CodeApprovalAlreadyDecided || byID[r.DecisionID].Option == winner.Option {
						t.Fatalf("rejection %+v of a %s decision; winner chose %s", r, byID[r.DecisionID].Option, winner.Option)
					}
				}
				if evs := h.Decisions(turn); len(evs) != 1 {
					t.Fatalf("%d decided events, want 1", len(evs))
				}
				content, written := h.File(session + ".txt")
				switch winner.Option {
				case schemas.OptionApprove:
					if !written || content != "approved" || b.Results[0].Status != schemas.ResultOK {
						t.Fatalf("approve won but file written=%v result %+v", written, b.Results[0])
					}
				default:
					if written || b.Results[0].Status != schemas.ResultDenied {
						t.Fatalf("deny won but file written=%v result %+v", written, b.Results[0])
					}
				}
			})
		}
	}
	applied := h.Metric("tollgate_decisions_total", map[string]string{"result": "applied"}) +
		h2.Metric("tollgate_decisions_total", map[string]string{"result": "applied"})
	if applied != 6 {
		t.Fatalf("%v decisions applied over 6 approvals, want exactly one each", applied)
	}
}

func TestPendingApprovalsGauge(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	const gauge = "tollgate_approvals_pending"
	_, a1 := pendingWrite(h, "gauge1", "g1.txt")
	turn2, a2 := pendingWrite(h, "gauge2", "g2.txt")
	h.WaitMetric(gauge, nil, 2)

	h.Decide(a1, schemas.OptionDeny, "alice")
	h.WaitMetric(gauge, nil, 1)
	h.Decide(a2, schemas.OptionApprove, "alice")
	h.WaitMetric(gauge, nil, 0)
	h.WaitTerminal(turn2)
	if got := h.Metric(gauge, nil); got != 0 {
		t.Fatalf("pending gauge %v after both decisions", got)
	}
	if got := h.Metric("tollgate_approvals_requested_total", nil); got != 2 {
		t.Fatalf("approvals requested %v, want 2", got)
	}
}

func TestBadDecisionsAreDeadLetteredAndTheApproverKeepsGoing(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	turn, id := pendingWrite(h, "dlq", "dlq.txt")
	encode := func(d *schemas.Decision) []byte {
		b, err := msgpack.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	valid := func() *schemas.Decision {
		d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
		d.V = schemas.DecisionVersion
		return d
	}
	tests := []struct {
		name    string
		subject string
		data    []byte
		code    schemas.Code
	}{
		{"bytes that are not msgpack", topology.DecisionSubject("cli", id), []byte("approve!"), schemas.CodeMalformed},
		{"a decision of an unknown version", topology.DecisionSubject("cli", id), encode(func() *schemas.Decision { d := valid(); d.V = 3; return d }()), schemas.CodeSchemaVersionUnsupported},
		{"a decision without an option", topology.DecisionSubject("cli", id), encode(func() *schemas.Decision { d := valid(); d.Option = ""; return d }()), schemas.CodeInvalidInput},
		{"a decision claiming another transport than its subject", topology.DecisionSubject("slack", id), encode(valid()), schemas.CodeInvalidInput},
		{"a decision filed under another approval's subject", topology.DecisionSubject("cli", schemas.ApprovalID(turn, 7)), encode(valid()), schemas.CodeInvalidInput},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			seq := h.PublishRaw(tc.subject, "", tc.data, nil)
			dls := h.WaitDLQ(pt.Approver, i+1)
			dl := dls[len(dls)-1]
			if dl.Header.Get(runner.HeaderCode) != string(tc.code) || !bytes.Equal(dl.Data, tc.data) || dl.Header.Get(runner.HeaderOriginalSeq) != fmt.Sprint(seq) {
				t.Fatalf("dead letter %v %q, want %s with the original bytes of seq %d", dl.Header, dl.Data, tc.code, seq)
			}
			if a := h.Approval(id); a.Status != schemas.ApprovalPending {
				t.Fatalf("approval %s after a dead-lettered decision", a.Status)
			}
			if _, ok := h.File("dlq.txt"); ok {
				t.Fatal("file written by a dead-lettered decision")
			}
		})
	}
	// A valid decision after them is applied.
	h.Decide(id, schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("result %+v", b.Results[0])
	}
	if c, ok := h.File("dlq.txt"); !ok || c != "approved" {
		t.Fatalf("file exists=%v %q", ok, c)
	}
	if got := h.Metric("tollgate_messages_dead_lettered_total", map[string]string{"stage": pt.Approver}); got != float64(len(tests)) {
		t.Fatalf("dead-lettered metric %v, want %d", got, len(tests))
	}
}
