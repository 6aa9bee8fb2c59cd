package pipelinetest_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// policyWith is the policy of the test: "guarded" in the given mode (the
// tool every attack aims at), "expiring" needs approval within 1s, echo
// runs freely, and a newer turn supersedes a session's waiting batch.
func policyWith(guarded string) string {
	return `{
  "version": "adversarial-` + guarded + `",
  "tools": {
    "echo":     {"approval": "never"},
    "guarded":  {"approval": "` + guarded + `"},
    "expiring": {"approval": "required", "expires_after": "1s"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}},
  "sessions": {"busy": "supersede"}
}`
}

// seen is what an attack produced, where it shows. Every row compares the
// whole of it, so a row asserts its codes and its side effect at once.
type seen struct {
	Rejected   schemas.Code         // the rejection of the attacking decision ("" if none)
	DeadLetter schemas.Code         // the dead-letter code of the attacking message ("" if none)
	Result     schemas.ResultStatus // the attacked call's result when its turn ended ("" if no turn)
	ResultCode schemas.Code
	Batch      schemas.BatchState // the attacked turn's batch when it ended ("" if no turn)
	BatchCode  schemas.Code
	Runs       int // how often the attacked call's tool ran: the side effect
}

// deniedAfter: the attack changed nothing, so the requester's own deny
// closes the turn and the call never runs.
func deniedAfter(rejected, dead schemas.Code) seen {
	return seen{Rejected: rejected, DeadLetter: dead, Result: schemas.ResultDenied, ResultCode: schemas.CodeApprovalDenied, Batch: schemas.BatchCompleted}
}

// failedClosed: the batch ends failed with code and nothing runs.
func failedClosed(rejected, code schemas.Code) seen {
	return seen{Rejected: rejected, Result: schemas.ResultFailed, ResultCode: code, Batch: schemas.BatchFailed, BatchCode: code}
}

// callFailed: the authority is intact but the call is unusable: the batch
// completes with that call failed and not run.
func callFailed(code schemas.Code) seen {
	return seen{Result: schemas.ResultFailed, ResultCode: code, Batch: schemas.BatchCompleted}
}

// TestAdversarial runs one attack per row against the four stages on a real
// embedded nats-server and checks that it is refused with its reason code
// and that the tool's side effect did not happen.
func TestAdversarial(t *testing.T) {
	guarded := &pt.Counter{ToolName: "guarded"}
	expiring := &pt.Counter{ToolName: "expiring"}
	shared := pt.Start(t, pt.Options{Policy: policyWith("required"), Tools: []tools.Tool{guarded, expiring}})

	tests := []struct {
		name   string
		attack func(t *testing.T, h *pt.H, session string) seen
		want   seen
	}{
		{
			name: "forged decision: someone who is neither the requester nor an approver approves",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "mallory"))
				return denyAfter(h, guarded, turn, id, seen{Rejected: rej})
			},
			want: deniedAfter(schemas.CodeDeciderNotAuthorized, ""),
		},
		{
			name: "replayed decision: the requester's deny is re-published after the approval was denied",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				d := h.Decision(id, schemas.OptionDeny, "cli", "alice")
				d.ArgsDigest = h.Approval(id).ArgsDigest
				data := encode(h, d)
				if rej := submitRaw(h, d, decisionSubject(d), d.DecisionID, data); rej != "" {
					t.Fatalf("the original deny was rejected with %s", rej)
				}
				got := ended(h, guarded, turn, seen{})
				// The same bytes again, under a message id the stream has
				// not seen (past its duplicate window, or chosen by the
				// attacker): an idempotent success that changes nothing.
				got.Rejected = submitRaw(h, d, decisionSubject(d), h.NextID("replay"), data)
				if a := h.Approval(id); a.Status != schemas.ApprovalDenied || a.Decision == nil || a.Decision.DecisionID != d.DecisionID {
					t.Errorf("approval %s decided by %+v after the replay, want denied by %s", a.Status, a.Decision, d.DecisionID)
				}
				h.WaitConsumedIn(pt.Redriver, topology.StreamEvents, reannounce(h, turn))
				if n := len(h.Decisions(turn)); n != 1 {
					t.Errorf("%d decided events after the replay, want 1", n)
				}
				if n := len(h.Outcomes(turn)); n != 1 {
					t.Errorf("%d outcome events after the replay, want 1", n)
				}
				got.Runs = guarded.Runs(schemas.CallID(turn, 0))
				return got
			},
			want: deniedAfter("", ""),
		},
		{
			name: "replayed decision: an approve of one call is re-published on another approval's subject",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				data, _ := approvedElsewhere(t, h, guarded, s+"-x")
				turn, id := pending(h, s, "guarded")
				dead := deadLetter(h, pt.Approver, topology.DecisionSubject("cli", id), data)
				return denyAfter(h, guarded, turn, id, seen{DeadLetter: dead})
			},
			want: deniedAfter("", schemas.CodeInvalidInput),
		},
		{
			name: "replayed decision: an approve of one call is rebound to another approval id",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				_, d := approvedElsewhere(t, h, guarded, s+"-x")
				turn, id := pending(h, s, "guarded")
				d.ApprovalID = id // same decision id, decider, option and the digest alice was shown
				rej := submitRaw(h, d, decisionSubject(d), h.NextID("rebound"), encode(h, d))
				return denyAfter(h, guarded, turn, id, seen{Rejected: rej})
			},
			want: deniedAfter(schemas.CodeArgsDigestMismatch, ""),
		},
		{
			name: "decision from a public channel for a personal (dm) turn",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
				d.Channel = &schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}
				return denyAfter(h, guarded, turn, id, seen{Rejected: decide(h, d)})
			},
			want: deniedAfter(schemas.CodeDeciderNotAuthorized, ""),
		},
		{
			name: "tampered audience: the approval's audience is widened to public in KV",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) { a.Context.Audience = schemas.AudiencePublic })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return recoverFailed(h, guarded, turn, seen{Rejected: rej})
			},
			// The approver refuses to authorize against the edited context;
			// the redriver finds the approval's context differs from its
			// batch's sealed one.
			want: failedClosed(schemas.CodeTurnContextTampered, schemas.CodeTurnContextMismatch),
		},
		{
			name: "tampered audience: the batch's audience is widened to public in KV",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.Audience = schemas.AudiencePublic })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return ended(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed("", schemas.CodeTurnContextTampered),
		},
		{
			name: "stripped seal: the batch's TurnContext loses its seal",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.Seal = nil })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return ended(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed("", schemas.CodeTurnContextTampered),
		},
		{
			name: "stripped seal: the approval's TurnContext loses its seal",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) { a.Context.Seal = nil })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return recoverFailed(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed(schemas.CodeTurnContextTampered, schemas.CodeTurnContextMismatch),
		},
		{
			name: "rotated-out key: the batch's TurnContext is sealed with a key not in the ring",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context = sealedWithOldKey(t, b.Context) })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return ended(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed("", schemas.CodeSealKeyUnknown),
		},
		{
			name: "rotated-out key: the approval's TurnContext is sealed with a key not in the ring",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) { a.Context = sealedWithOldKey(t, a.Context) })
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return recoverFailed(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed(schemas.CodeSealKeyUnknown, schemas.CodeTurnContextMismatch),
		},
		{
			name: "v1 record missing a field: the approval is rewritten as version 1 without its audience",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.PutRaw(h.Store.Approvals.KV, id, asV1Without(t, h.Approval(id), "audience"))
				rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				return recoverFailed(h, guarded, turn, seen{Rejected: rej})
			},
			want: failedClosed(schemas.CodeLegacyContextIncomplete, schemas.CodeLegacyContextIncomplete),
		},
		{
			name: "option not offered: the requester answers with an option the prompt did not show",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				return denyAfter(h, guarded, turn, id, seen{Rejected: decide(h, h.Decision(id, "approve_always", "cli", "alice"))})
			},
			want: deniedAfter(schemas.CodeOptionNotOffered, ""),
		},
		{
			name: "changed arguments: the decision carries the digest of other arguments",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
				_, d.ArgsDigest, _ = schemas.CanonicalArgs(`{"session":"someone else's"}`)
				return denyAfter(h, guarded, turn, id, seen{Rejected: decide(h, d)})
			},
			want: deniedAfter(schemas.CodeArgsDigestMismatch, ""),
		},
		{
			name: "changed arguments: the batch's call arguments are swapped in KV after the prompt",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Calls[0].Args = `{"session":"evil"}` })
				d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
				d.ArgsDigest = h.Approval(id).ArgsDigest // what alice was shown
				return ended(h, guarded, turn, seen{Rejected: decide(h, d)})
			},
			want: callFailed(schemas.CodeArgsDigestMismatch),
		},
		{
			name: "changed arguments: the batch's call arguments and their digest are swapped in KV",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				h.MutateBatch(turn, func(b *schemas.BatchRecord) {
					b.Calls[0].Args, b.Calls[0].ArgsDigest, _ = schemas.CanonicalArgs(`{"session":"evil"}`)
				})
				return ended(h, guarded, turn, seen{Rejected: decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))})
			},
			want: failedClosed("", schemas.CodeTurnContextMismatch),
		},
		{
			name: "expired approval: nobody answers within 1s, then the requester approves late",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn := h.Send(h.Inbound(s, "alice", pt.Call("expiring", fmt.Sprintf(`{"session":%q}`, s))))
				id := schemas.ApprovalID(turn, 0)
				got := ended(h, expiring, turn, seen{})
				if a := h.Approval(id); a.Status != schemas.ApprovalExpired {
					t.Errorf("approval %s, want expired", a.Status)
				}
				got.Rejected = decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				if a := h.Approval(id); a.Status != schemas.ApprovalExpired {
					t.Errorf("the late decision moved the approval to %s", a.Status)
				}
				h.WaitConsumedIn(pt.Redriver, topology.StreamEvents, reannounce(h, turn))
				got.Runs = expiring.Runs(schemas.CallID(turn, 0))
				return got
			},
			want: seen{Rejected: schemas.CodeApprovalExpired, Result: schemas.ResultExpired, ResultCode: schemas.CodeApprovalExpired, Batch: schemas.BatchCompleted},
		},
		{
			name: "policy flipped to deny: approved while no redriver ran, redriven under a policy that denies the tool",
			attack: func(t *testing.T, _ *pt.H, s string) seen {
				count := &pt.Counter{ToolName: "guarded"}
				h, turn, _, rej := approvedWithoutRedriver(t, s, count)
				h.Stop()
				r := redriverOnly(t, h, policyWith("deny"), count)
				return ended(r, count, turn, seen{Rejected: rej})
			},
			want: callFailed(schemas.CodePolicyChanged),
		},
		{
			name: "supersede during redrive: a newer turn arrives while the batch waits, then the stale prompt is approved",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				old, id := pending(h, s, "guarded")
				next := h.Send(h.Inbound(s, "alice", pt.Call("echo", `{"text":"newer"}`)))
				got := ended(h, guarded, old, seen{})
				if nb, _ := h.WaitTerminal(next); nb.State != schemas.BatchCompleted {
					t.Errorf("the superseding turn ended %s", nb.State)
				}
				got.Rejected = decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice"))
				h.WaitConsumedIn(pt.Redriver, topology.StreamEvents, reannounce(h, old))
				got.Runs = guarded.Runs(schemas.CallID(old, 0))
				return got
			},
			want: seen{Rejected: schemas.CodeApprovalAlreadyDecided, Result: schemas.ResultAbandoned, ResultCode: schemas.CodeTurnSuperseded, Batch: schemas.BatchCompleted},
		},
		{
			name: "supersede during redrive: the approval was already decided when the newer turn arrived, so the call runs exactly once",
			attack: func(t *testing.T, _ *pt.H, s string) seen {
				count := &pt.Counter{ToolName: "guarded"}
				h, old, id, rej := approvedWithoutRedriver(t, s, count)
				next := h.Send(h.Inbound(s, "alice", pt.Call("echo", `{"text":"newer"}`)))
				h.WaitState(next, schemas.BatchQueued)
				h.WaitIdle(pt.Executor) // its supersede check has run
				if a := h.Approval(id); a.Status != schemas.ApprovalApproved {
					t.Errorf("supersede changed a decided approval to %s", a.Status)
				}
				r := redriverOnly(t, h, policyWith("required"), count)
				got := ended(r, count, old, seen{Rejected: rej})
				// Told again, it does not run again.
				r.WaitConsumedIn(pt.Redriver, topology.StreamEvents, reannounce(r, old))
				got.Runs = count.Runs(schemas.CallID(old, 0))
				if nb, _ := r.WaitTerminal(next); nb.State != schemas.BatchCompleted {
					t.Errorf("the newer turn ended %s", nb.State)
				}
				return got
			},
			want: seen{Result: schemas.ResultOK, Batch: schemas.BatchCompleted, Runs: 1},
		},
		{
			name: "oversized payload: an inbound message whose arguments exceed the limit (and one over 1 MiB)",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				before := guarded.Total()
				m := h.Inbound(s, "alice", pt.Call("guarded", fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", schemas.MaxArgsBytes))))
				m.V = schemas.InboundVersion
				got := seen{DeadLetter: deadLetter(h, pt.Ingest, topology.InboundSubject("cli", m.SessionID), marshal(t, m))}
				if b := h.Batch(schemas.TurnID("cli", m.MessageID)); b != nil {
					t.Errorf("an oversized message became turn %s (%s)", b.TurnID, b.State)
				}
				// Over 1 MiB the bus itself refuses it: no stage ever sees it.
				ctx, cancel := h.Ctx()
				defer cancel()
				if _, err := h.JS.PublishMsg(ctx, &nats.Msg{Subject: topology.InboundSubject("cli", "s1"), Data: bytes.Repeat([]byte{0x80}, schemas.MaxPayloadBytes+1)}); err == nil {
					t.Errorf("a message over 1 MiB was accepted by the inbound stream")
				}
				got.Runs = guarded.Total() - before
				return got
			},
			want: seen{DeadLetter: schemas.CodePayloadTooLarge},
		},
		{
			name: "oversized payload: a decision whose note exceeds the limit",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
				d.V, d.Note = schemas.DecisionVersion, strings.Repeat("n", schemas.MaxNoteBytes+1)
				got := seen{DeadLetter: deadLetter(h, pt.Approver, decisionSubject(d), marshal(t, d))}
				got.Rejected = rejectionOf(h, d)
				return denyAfter(h, guarded, turn, id, got)
			},
			want: deniedAfter("", schemas.CodePayloadTooLarge),
		},
		{
			name: "malformed msgpack: garbage on the inbound subject",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				before := guarded.Total()
				got := seen{DeadLetter: deadLetter(h, pt.Ingest, topology.InboundSubject("cli", "s1"), []byte("\xc1guarded please\xff"))}
				got.Runs = guarded.Total() - before
				return got
			},
			want: seen{DeadLetter: schemas.CodeMalformed},
		},
		{
			name: "malformed msgpack: garbage on a pending approval's decision subject",
			attack: func(t *testing.T, h *pt.H, s string) seen {
				turn, id := pending(h, s, "guarded")
				dead := deadLetter(h, pt.Approver, topology.DecisionSubject("cli", id), []byte{0xdf, 0x00, 0x00, 0x00, 0x01, 0xa6, 'o', 'p', 't', 'i', 'o', 'n'})
				return denyAfter(h, guarded, turn, id, seen{DeadLetter: dead})
			},
			want: deniedAfter("", schemas.CodeMalformed),
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.attack(t, shared.For(t), fmt.Sprintf("adv%d", i))
			if got != tc.want {
				t.Fatalf("attack produced\n  %+v\nwant\n  %+v", got, tc.want)
			}
		})
	}
}

// ----- driving -----

// pending sends alice's turn (in her DM) with one call of tool and waits
// for its approval to be pending, and for the redriver's answer to the
// batch's awaiting notice (deferred: the approval is pending), so that an
// attack made after this returns reaches the pipeline through the decision
// alone. Without that
// wait, a batch tampered with in KV could be failed on the awaiting notice
// first, and the decision then rejected as already decided (its approval
// abandoned): just as safe, but not the row's expected outcome.
func pending(h *pt.H, session, tool string) (turn, approvalID string) {
	h.T.Helper()
	turn, approvalID = requested(h, session, tool)
	// Waiting, the batch is looked at by nothing but a decided event (or
	// the sweep): the executor announces nothing.
	h.WaitState(turn, schemas.BatchAwaiting)
	return turn, approvalID
}

// requested is pending for a pipeline without a redriver: the approval is
// pending in KV.
func requested(h *pt.H, session, tool string) (turn, approvalID string) {
	h.T.Helper()
	turn = h.Send(h.Inbound(session, "alice", pt.Call(tool, fmt.Sprintf(`{"session":%q}`, session))))
	approvalID = schemas.ApprovalID(turn, 0)
	h.WaitPending(approvalID)
	return turn, approvalID
}

// approvedElsewhere has alice approve (showing the digest) a guarded call of
// another session, which runs once as it should, and returns that decision
// and its bytes: what an attacker could capture and replay.
func approvedElsewhere(t *testing.T, h *pt.H, count *pt.Counter, session string) ([]byte, *schemas.Decision) {
	t.Helper()
	turn, id := pending(h, session, "guarded")
	d := h.Decision(id, schemas.OptionApprove, "cli", "alice")
	d.ArgsDigest = h.Approval(id).ArgsDigest
	data := encode(h, d)
	if rej := submitRaw(h, d, decisionSubject(d), d.DecisionID, data); rej != "" {
		t.Fatalf("alice's own approval was rejected with %s", rej)
	}
	if got := ended(h, count, turn, seen{}); got.Result != schemas.ResultOK || got.Runs != 1 {
		t.Fatalf("alice's approved call: %+v, want run once", got)
	}
	return data, d
}

// approvedWithoutRedriver runs every stage but the redriver under the
// test's policy; alice's guarded call is requested and approved, and its
// decided event waits in the stream for a redriver yet to start.
func approvedWithoutRedriver(t *testing.T, session string, count *pt.Counter) (h *pt.H, turn, approvalID string, rejected schemas.Code) {
	t.Helper()
	h = pt.Start(t, pt.Options{Policy: policyWith("required"), Tools: []tools.Tool{count},
		Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
	turn, approvalID = requested(h, session, "guarded")
	rejected = decide(h, h.Decision(approvalID, schemas.OptionApprove, "cli", "alice"))
	h.WaitApproval(approvalID, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	if n := len(h.Decisions(turn)); n != 1 {
		t.Fatalf("%d decided events before the redriver starts, want 1", n)
	}
	return h, turn, approvalID, rejected
}

// redriverOnly starts a redriver under policy on h's server and keys (a
// deploy of the redriver).
func redriverOnly(t *testing.T, h *pt.H, policy string, count *pt.Counter) *pt.H {
	t.Helper()
	return pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policy, Tools: []tools.Tool{count}, Stages: []string{pt.Redriver}})
}

func decisionSubject(d *schemas.Decision) string {
	return topology.DecisionSubject(d.Transport, d.ApprovalID)
}

// decide submits d as a transport would and returns its rejection code
// ("" if it was applied or idempotent).
func decide(h *pt.H, d *schemas.Decision) schemas.Code {
	h.T.Helper()
	return submitRaw(h, d, decisionSubject(d), d.DecisionID, encode(h, d))
}

// submitRaw publishes data (decision d, or bytes claiming to be it) and
// waits until the approver has finished with it.
func submitRaw(h *pt.H, d *schemas.Decision, subject, msgID string, data []byte) schemas.Code {
	h.T.Helper()
	h.WaitConsumed(pt.Approver, h.PublishRaw(subject, msgID, data, nil))
	return rejectionOf(h, d)
}

// rejectionOf returns the code of the stored rejection of d, or "". The
// approver publishes a rejection before it acknowledges the decision.
func rejectionOf(h *pt.H, d *schemas.Decision) schemas.Code {
	h.T.Helper()
	token := d.ApprovalID
	if !schemas.ValidKey(token) {
		token = "invalid"
	}
	for _, r := range h.Rejections(token) {
		if r.DecisionID == d.DecisionID {
			return r.Code
		}
	}
	return ""
}

// deadLetter publishes data on subject, waits until stage has finished with
// it, and returns the code of its dead letter ("" if there is none). The
// dead letter must carry the original bytes.
func deadLetter(h *pt.H, stage, subject string, data []byte) schemas.Code {
	h.T.Helper()
	seq := h.PublishRaw(subject, h.NextID("raw"), data, nil)
	h.WaitConsumed(stage, seq)
	for _, dl := range h.DLQ(stage) {
		if dl.Header.Get(runner.HeaderOriginalSeq) != fmt.Sprint(seq) || dl.Header.Get(runner.HeaderOriginalSubject) != subject {
			continue
		}
		if !bytes.Equal(dl.Data, data) || dl.Header.Get(runner.HeaderStage) != stage {
			h.T.Errorf("dead letter %v %q does not carry the original message", dl.Header, dl.Data)
		}
		return schemas.Code(dl.Header.Get(runner.HeaderCode))
	}
	return ""
}

// reannounce publishes the batch-awaiting notice of turn again, as a
// recovery pass would, so the redriver evaluates its barrier; it returns the
// notice's stream sequence.
func reannounce(h *pt.H, turn string) uint64 {
	h.T.Helper()
	return h.Publish(topology.EventSubject(topology.SubjectBatchAwaiting, turn), h.NextID("recover"),
		&schemas.TurnNotice{TurnID: turn, SessionID: "x", Kind: schemas.NoticeAwaiting, At: time.Now()})
}

// ----- observing -----

// ended waits for turn's terminal batch and outcome and adds what they show
// about call 0 to got.
func ended(h *pt.H, count *pt.Counter, turn string, got seen) seen {
	h.T.Helper()
	b, out := h.WaitTerminal(turn)
	r := b.Results[0]
	got.Result, got.ResultCode, got.Batch, got.BatchCode = r.Status, r.Code, b.State, b.Code
	got.Runs = count.Runs(schemas.CallID(turn, 0))
	if b.State == schemas.BatchFailed && (out.State != schemas.TurnFailed || out.Code != b.Code) {
		h.T.Errorf("outcome %s %s for a batch failed with %s", out.State, out.Code, b.Code)
	}
	if b.State == schemas.BatchCompleted && (len(out.Results) == 0 || out.Results[0].Status != r.Status || out.Results[0].Code != r.Code) {
		h.T.Errorf("outcome results %+v do not carry the batch's result %+v", out.Results, r)
	}
	return got
}

// denyAfter: after a rejected or dead-lettered attack on an intact pending
// approval, the approval is untouched, and a recovery pass does not run the
// call; the requester then denies and the turn ends.
func denyAfter(h *pt.H, count *pt.Counter, turn, id string, got seen) seen {
	h.T.Helper()
	if a := h.Approval(id); a.Status != schemas.ApprovalPending || a.Decision != nil || len(a.Votes) != 0 {
		h.T.Errorf("approval %s decision %+v after the attack, want pending and untouched", a.Status, a.Decision)
	}
	h.WaitConsumedIn(pt.Redriver, topology.StreamEvents, reannounce(h, turn))
	if b := h.Batch(turn); b.State != schemas.BatchAwaiting {
		h.T.Errorf("batch %s after the attack and a recovery pass, want awaiting", b.State)
	}
	if n := count.Runs(schemas.CallID(turn, 0)); n != 0 {
		h.T.Errorf("the tool ran %d times before anyone authorized it", n)
	}
	h.Decide(id, schemas.OptionDeny, "alice")
	return ended(h, count, turn, got)
}

// recoverFailed: nothing was decided, so nothing triggers a redrive; a recovery
// pass must end the batch failed closed.
func recoverFailed(h *pt.H, count *pt.Counter, turn string, got seen) seen {
	h.T.Helper()
	reannounce(h, turn)
	got = ended(h, count, turn, got)
	if n := h.Starts(turn); n != 0 {
		h.T.Errorf("%d started redrives for a batch whose authority was tampered with", n)
	}
	return got
}

// ----- tampering -----

// sealedWithOldKey returns a copy of tc, unchanged but sealed with key
// "old" of a ring the pipeline does not hold (a key rotated out).
func sealedWithOldKey(t *testing.T, tc *schemas.TurnContext) *schemas.TurnContext {
	t.Helper()
	old, err := seal.NewFile("old").Ring()
	if err != nil {
		t.Fatal(err)
	}
	cp := *tc
	cp.Seal = nil
	if err := old.Seal(&cp); err != nil {
		t.Fatal(err)
	}
	return &cp
}

// asV1Without rewrites a in the version 1 shape (no TurnContext, copies of
// its authority fields) and leaves out the copied field drop.
func asV1Without(t *testing.T, a *schemas.ApprovalRecord, drop string) []byte {
	t.Helper()
	tc := a.Context
	sender := schemas.Sender{ID: tc.Requester.SenderID, Kind: tc.Requester.Kind, Verified: tc.Requester.Verified}
	ch := tc.Channel
	var m map[string]any
	if err := msgpack.Unmarshal(marshal(t, &schemas.ApprovalRecordV1{
		V: schemas.ApprovalLegacyVersion, ApprovalID: a.ApprovalID, TurnID: a.TurnID, SessionID: a.SessionID, CallID: a.CallID,
		Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest, PolicyVersion: a.PolicyVersion, Options: a.Options,
		Status: a.Status, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
		Transport: tc.Transport, Sender: &sender, Channel: &ch, Audience: tc.Audience, TrustBoundary: tc.TrustBoundary,
	}), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m[drop]; !ok {
		t.Fatalf("a version 1 record has no field %q to leave out", drop)
	}
	delete(m, drop)
	return marshal(t, m)
}

// ----- encoding -----

func encode(h *pt.H, r schemas.Record) []byte {
	h.T.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		h.T.Fatal(err)
	}
	return b
}

// marshal encodes v without validation (for input the encoder would refuse).
func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
