package slack_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// Each attack gets its status and reason, and publishes nothing it should
// not: no decision for a refused click, no inbound message for a refused
// or bot event.
func TestAdversarialRequests(t *testing.T) {
	r := startRig(t)
	const ch = "DU1"
	// Two pending DM prompts, one that expires, and a team prompt in a
	// private channel.
	r.slack.convTypes["G1"] = "private"
	r.event(t, "EvA", dm("U1", ch, "1700000001.000100", "write a.txt"))
	r.event(t, "EvB", dm("U1", ch, "1700000002.000100", "write b.txt"))
	r.event(t, "EvE", dm("U1", ch, "1700000003.000100", "echo soon"))
	r.event(t, "EvG", map[string]any{"type": "app_mention", "user": "U1", "channel": "G1", "ts": "1700000004.000100", "text": "<@UBOT> write g.txt"})
	idA := schemas.ApprovalID(turnOf(ch, "1700000001.000100"), 0)
	idB := schemas.ApprovalID(turnOf(ch, "1700000002.000100"), 0)
	idE := schemas.ApprovalID(turnOf(ch, "1700000003.000100"), 0)
	idG := schemas.ApprovalID(turnOf("G1", "1700000004.000100"), 0)
	pA, pB, pE, pG := r.promptOf(t, idA), r.promptOf(t, idB), r.promptOf(t, idE), r.promptOf(t, idG)
	if pG.form.Get("channel") != "G1" || pG.form.Get("thread_ts") != "1700000004.000100" {
		t.Fatalf("team prompt went to %s/%s, want the mention's thread", pG.form.Get("channel"), pG.form.Get("thread_ts"))
	}
	valA, valB, valE, valG := buttonValue(t, pA, tgslack.ActionApprove), buttonValue(t, pB, tgslack.ActionApprove),
		buttonValue(t, pE, tgslack.ActionApprove), buttonValue(t, pG, tgslack.ActionApprove)
	r.awaitStatus(t, idE, schemas.ApprovalExpired)
	r.slack.await(t, 1, "chat.update", func(c call) bool {
		return c.form.Get("ts") == pE.ts && strings.Contains(c.form.Get("blocks"), "Expired")
	})

	now := time.Now()
	notAuthorized := clickBody("U2", "G1", pG.ts, tgslack.ActionApprove, valG, "9.1")
	rows := []struct {
		name      string
		send      func(t *testing.T) *http.Response
		status    int
		reason    string
		stream    string // whose message count must not grow
		published uint64 // how many messages it may add
	}{
		{"a forged signature is refused", func(t *testing.T) *http.Response {
			return r.send(t, "/slack/interactivity", form, clickBody("U1", ch, pA.ts, tgslack.ActionApprove, valA, "1.1"), now, "not-the-secret")
		}, 401, tgslack.ReasonBadSignature, topology.StreamDecisions, 0},
		{"a request signed more than 5 minutes ago is refused", func(t *testing.T) *http.Response {
			return r.send(t, "/slack/interactivity", form, clickBody("U1", ch, pA.ts, tgslack.ActionApprove, valA, "1.2"), now.Add(-6*time.Minute), secret)
		}, 401, tgslack.ReasonStaleTimestamp, topology.StreamDecisions, 0},
		{"an action id Tollgate never sent is refused", func(t *testing.T) *http.Response {
			return r.click(t, clickBody("U1", ch, pA.ts, "tollgate_launch", valA, "1.3"))
		}, 400, tgslack.ReasonUnknownAction, topology.StreamDecisions, 0},
		{"a button value edited to another approval is refused", func(t *testing.T) *http.Response {
			return r.click(t, clickBody("U1", ch, pA.ts, tgslack.ActionApprove, valB, "1.4"))
		}, 400, tgslack.ReasonActionMismatch, topology.StreamDecisions, 0},
		{"a button value with another digest is refused", func(t *testing.T) *http.Response {
			return r.click(t, clickBody("U1", ch, pA.ts, tgslack.ActionApprove, idA+" sha256:00", "1.5"))
		}, 400, tgslack.ReasonActionMismatch, topology.StreamDecisions, 0},
		{"a click on an expired prompt publishes nothing", func(t *testing.T) *http.Response {
			return r.click(t, clickBody("U1", ch, pE.ts, tgslack.ActionApprove, valE, "1.6"))
		}, 200, tgslack.ReasonNotPending, topology.StreamDecisions, 0},
		// Both sent signed at now: the second is the first request byte
		// for byte (signed at its own time.Now, it could fall in the next
		// second and be a new request, which is refused as a duplicate
		// action instead).
		{"a click by a user who may not decide goes to the approver", func(t *testing.T) *http.Response {
			return r.send(t, "/slack/interactivity", form, notAuthorized, now, secret)
		}, 200, "", topology.StreamDecisions, 1},
		{"the same signed click again is a replay", func(t *testing.T) *http.Response {
			return r.send(t, "/slack/interactivity", form, notAuthorized, now, secret)
		}, 400, tgslack.ReasonReplayed, topology.StreamDecisions, 0},
		{"a bot's message is not a turn", func(t *testing.T) *http.Response {
			return r.event(t, "EvBot", map[string]any{"type": "message", "channel_type": "im", "bot_id": "B1", "subtype": "bot_message", "channel": ch, "ts": "1700000005.000100", "text": "write evil.txt"})
		}, 200, tgslack.ReasonBotMessage, topology.StreamInbound, 0},
		{"Tollgate's own message is not a turn", func(t *testing.T) *http.Response {
			return r.event(t, "EvOwn", dm(botUser, ch, "1700000006.000100", "write evil.txt"))
		}, 200, tgslack.ReasonBotMessage, topology.StreamInbound, 0},
		{"Slack's retry of an event already handled publishes nothing", func(t *testing.T) *http.Response {
			return r.event(t, "EvA", dm("U1", ch, "1700000001.000100", "write a.txt"))
		}, 200, tgslack.ReasonDuplicate, topology.StreamInbound, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before, refused := r.msgs(t, row.stream), r.refused(t, row.reason)
			resp := row.send(t)
			if resp.StatusCode != row.status {
				t.Errorf("status %d, want %d", resp.StatusCode, row.status)
			}
			if got := r.msgs(t, row.stream) - before; got != row.published {
				t.Errorf("%s grew by %d, want %d", row.stream, got, row.published)
			}
			if row.reason != "" && r.refused(t, row.reason) != refused+1 {
				t.Errorf("tollgate_slack_refused_total{reason=%q} did not grow", row.reason)
			}
		})
	}

	// The expired click told the clicker why, ephemerally.
	r.slack.await(t, 1, "chat.postEphemeral", func(c call) bool {
		return c.form.Get("user") == "U1" && strings.Contains(c.form.Get("text"), string(schemas.CodeApprovalExpired))
	})
	// The approver refused the unauthorized clicker: an ephemeral with the
	// code, in the prompt's channel, and the prompt stays open.
	r.slack.await(t, 1, "chat.postEphemeral", func(c call) bool {
		return c.form.Get("user") == "U2" && c.form.Get("channel") == "G1" && strings.Contains(c.form.Get("text"), string(schemas.CodeDeciderNotAuthorized))
	})
	if s := r.approvalStatus(t, idG); s != schemas.ApprovalPending {
		t.Errorf("team approval is %s after an unauthorized click, want pending", s)
	}
	// Nothing approved A, B or G: their prompts were never updated, and
	// the requester can still decide G from the channel.
	if resp := r.click(t, clickBody("U1", "G1", pG.ts, tgslack.ActionApprove, valG, "9.2")); resp.StatusCode != 200 {
		t.Fatalf("requester's click: %d", resp.StatusCode)
	}
	r.awaitStatus(t, idG, schemas.ApprovalApproved)
	r.slack.await(t, 1, "chat.update", func(c call) bool { return c.form.Get("ts") == pG.ts })
	for _, p := range []call{pA, pB} {
		if n := len(r.slack.find("chat.update", func(c call) bool { return c.form.Get("ts") == p.ts })); n != 0 {
			t.Errorf("prompt %s was updated %d times without a decision", p.ts, n)
		}
	}
	if s := r.approvalStatus(t, idA); s != schemas.ApprovalPending {
		t.Errorf("approval A is %s, want pending", s)
	}
}

// A personal-audience prompt goes to the requester's own DM, opened with
// conversations.open, never to another conversation, even when the turn's
// channel is a different one.
func TestPersonalPromptGoesOnlyToTheRequestersDM(t *testing.T) {
	r := startRig(t)
	// An im that is not the one conversations.open answers for U1 (DU1).
	r.event(t, "EvP", dm("U1", "DOTHER", "1700000010.000100", "write p.txt"))
	id := schemas.ApprovalID(turnOf("DOTHER", "1700000010.000100"), 0)
	p := r.promptOf(t, id)
	if p.form.Get("channel") != "DU1" || p.form.Get("thread_ts") != "" {
		t.Errorf("personal prompt posted to %s (thread %q), want the requester's DM DU1", p.form.Get("channel"), p.form.Get("thread_ts"))
	}
	if open := r.slack.find("conversations.open", func(c call) bool { return c.form.Get("users") == "U1" }); len(open) == 0 {
		t.Error("the requester's DM was not opened with conversations.open")
	}
	if n := len(r.slack.find("chat.postMessage", func(c call) bool { return !strings.HasPrefix(c.form.Get("channel"), "D") })); n != 0 {
		t.Errorf("%d messages went to a shared channel", n)
	}
}
