package slack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// viewSubmission is a signed view_submission payload of the deny modal.
func viewSubmission(user, meta, reason string) []byte {
	p, _ := json.Marshal(map[string]any{
		"type": "view_submission", "team": map[string]any{"id": team}, "user": map[string]any{"id": user},
		"view": map[string]any{"id": "V1", "hash": "h-" + reason, "callback_id": tgslack.ViewDeny, "private_metadata": meta,
			"state": map[string]any{"values": map[string]any{"reason": map[string]any{"reason_input": map[string]any{"type": "plain_text_input", "value": reason}}}}},
	})
	return []byte(url.Values{"payload": {string(p)}}.Encode())
}

// view is the modal a views.open call opened.
func view(c call) map[string]any {
	v, _ := c.json["view"].(map[string]any)
	return v
}

// Deny opens a modal (views.open with the click's trigger id); submitting
// it with a reason denies the call, which never runs, with the reason as
// the decision's note, and closes the prompt showing the note inert.
func TestDenyOpensAModalAndItsReasonDenies(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000020.000100"
	r.event(t, "EvD", dm("U1", ch, ts, "write denied.txt"))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	before := r.msgs(t, "TOLLGATE_DECISIONS")
	if resp := r.click(t, clickBody("U1", ch, p.ts, tgslack.ActionDeny, buttonValue(t, p, tgslack.ActionDeny), "2.1")); resp.StatusCode != 200 {
		t.Fatalf("deny click: %d", resp.StatusCode)
	}
	open := r.slack.await(t, 1, "views.open", nil)[0]
	if open.json["trigger_id"] != "trigger-2.1" || view(open)["callback_id"] != tgslack.ViewDeny {
		t.Fatalf("views.open: %v", open.json)
	}
	if got := r.msgs(t, "TOLLGATE_DECISIONS"); got != before {
		t.Fatalf("the deny click published %d decisions before the modal was submitted", got-before)
	}
	meta, _ := view(open)["private_metadata"].(string)

	// A modal bound to another approval's prompt is refused.
	forged := strings.Replace(meta, id, schemas.ApprovalID(turnOf(ch, "1"), 0), 1)
	if resp := r.click(t, viewSubmission("U1", forged, "x")); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("forged modal metadata: %d, want 400", resp.StatusCode)
	}
	const reason = "not today <!channel> <http://evil.example|bank.com> ```x```"
	if resp := r.click(t, viewSubmission("U1", meta, reason)); resp.StatusCode != 200 {
		t.Fatalf("submit: %d", resp.StatusCode)
	}
	r.awaitStatus(t, id, schemas.ApprovalDenied)
	if d := r.h.Approval(id).Decision; d == nil || d.Note != reason {
		t.Errorf("decision: %+v, want the reason as its note", d)
	}
	up := r.slack.await(t, 1, "chat.update", func(c call) bool { return c.form.Get("ts") == p.ts })[0]
	if !strings.Contains(up.form.Get("blocks"), "Denied") || strings.Contains(up.form.Get("blocks"), tgslack.ActionDeny) {
		t.Errorf("closed prompt: %s", up.form.Get("blocks"))
	}
	var blocks []struct {
		Text struct{ Text string } `json:"text"`
	}
	_ = json.Unmarshal([]byte(up.form.Get("blocks")), &blocks)
	shown := fmt.Sprint(blocks)
	if !strings.Contains(shown, "not today &lt;!channel&gt; &lt;http://evil.example|bank.com&gt;") || strings.Contains(shown, "<!channel>") {
		t.Errorf("the closed prompt does not show the note escaped: %s", shown)
	}
	res := r.slack.await(t, 2, "chat.postMessage", in(ch))[1]
	if !strings.Contains(res.form.Get("text"), "denied") {
		t.Errorf("result: %s", res.form.Get("text"))
	}
}

// Long arguments are folded in the prompt; the full text is one click
// away, in a modal.
func TestFoldedArgumentsOpenInAModal(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000030.000100"
	long := strings.Repeat("x", 2*tgslack.FoldArgs)
	r.event(t, "EvL", dm("U1", ch, ts, "write "+long))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	if strings.Contains(p.form.Get("blocks"), long) {
		t.Fatal("the prompt shows the long arguments unfolded")
	}
	before := r.msgs(t, "TOLLGATE_DECISIONS")
	if resp := r.click(t, clickBody("U1", ch, p.ts, tgslack.ActionArgs, buttonValue(t, p, tgslack.ActionArgs), "3.1")); resp.StatusCode != 200 {
		t.Fatalf("click: %d", resp.StatusCode)
	}
	open := r.slack.await(t, 1, "views.open", nil)[0]
	body, _ := json.Marshal(open.json)
	if !strings.Contains(string(body), long) {
		t.Errorf("the modal lacks the full arguments")
	}
	if r.msgs(t, "TOLLGATE_DECISIONS") != before || r.approvalStatus(t, id) != schemas.ApprovalPending {
		t.Error("showing the arguments decided something")
	}
}

// A decision taken elsewhere while the transport was down is shown when
// it comes back: the durable consumer catches up, the prompt is updated
// and the result posted.
func TestPromptsCatchUpAfterDowntime(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000040.000100"
	r.event(t, "EvC", dm("U1", ch, ts, "write later.txt"))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	r.shutdown()
	// The requester approves from another client (the CLI) meanwhile.
	r.h.Submit(r.h.Decision(id, schemas.OptionApprove, tgslack.Name, team+":U1"))
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	if n := len(r.slack.find("chat.update", nil)); n != 0 {
		t.Fatalf("%d updates while the transport was down", n)
	}
	r.start(t)
	up := r.slack.await(t, 1, "chat.update", func(c call) bool { return c.form.Get("ts") == p.ts })[0]
	if !strings.Contains(up.form.Get("blocks"), "Approved") {
		t.Errorf("closed prompt: %s", up.form.Get("blocks"))
	}
	r.slack.await(t, 2, "chat.postMessage", in(ch))
}

// A burst of posts into one channel answered 429 with Retry-After is
// delayed by it, in order, and none is lost.
func TestRateLimitedBurstIsDelayedNotLost(t *testing.T) {
	r := startRig(t)
	r.slack.mu.Lock()
	r.slack.limit429 = 2
	r.slack.mu.Unlock()
	const n = 5
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs <- r.tr.DeliverOutcome(ctx, &schemas.TurnOutcome{
				TurnID: fmt.Sprintf("t-burst%d", i), State: schemas.TurnCompleted, Audience: schemas.AudiencePublic,
				Reply: schemas.ReplyTarget{Transport: tgslack.Name, Channel: schemas.Channel{ID: "C9", Kind: schemas.ChannelPublic, Thread: "1.0"}},
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("deliver: %v", err)
		}
	}
	posts := r.slack.find("chat.postMessage", in("C9"))
	if len(posts) != n || len(r.slack.find("429", nil)) != 2 {
		t.Fatalf("%d posts and %d 429s, want %d and 2", len(posts), len(r.slack.find("429", nil)), n)
	}
	for i := range n {
		want := fmt.Sprintf("t-burst%d", i)
		if c := r.slack.find("chat.postMessage", func(c call) bool { return strings.Contains(c.form.Get("text"), want) }); len(c) != 1 {
			t.Errorf("%s posted %d times", want, len(c))
		}
	}
	if el := time.Since(start); el < 2*time.Second {
		t.Errorf("the burst took %v: the Retry-After of two 429s (1s each) was not waited out", el)
	}
}

// In a channel, a mention starts a served thread: a reply in it is a turn
// of the same session without a mention; a channel message outside it,
// or a reply in another thread, is not.
func TestThreadRepliesInServedThreadsOnly(t *testing.T) {
	r := startRig(t)
	r.slack.convTypes["C1"] = "public"
	const root = "1700000060.000100"
	r.event(t, "EvM", map[string]any{"type": "app_mention", "user": "U1", "channel": "C1", "ts": root, "text": "<@UBOT> hello"})
	r.slack.await(t, 1, "chat.postMessage", in("C1"))
	inbound := r.msgs(t, "TOLLGATE_INBOUND")
	ignored := r.refused(t, tgslack.ReasonIgnored)
	chanMsg := func(ts, thread string) map[string]any {
		m := map[string]any{"type": "message", "channel_type": "channel", "user": "U1", "channel": "C1", "ts": ts, "text": "more"}
		if thread != "" {
			m["thread_ts"] = thread
		}
		return m
	}
	r.event(t, "EvR1", chanMsg("1700000061.000100", "1700000001.999999"))
	r.event(t, "EvR2", chanMsg("1700000062.000100", ""))
	if got := r.msgs(t, "TOLLGATE_INBOUND"); got != inbound || r.refused(t, tgslack.ReasonIgnored) != ignored+2 {
		t.Fatalf("messages outside the served thread published %d inbound messages", got-inbound)
	}
	r.event(t, "EvR3", chanMsg("1700000063.000100", root))
	if got := r.msgs(t, "TOLLGATE_INBOUND"); got != inbound+1 {
		t.Fatalf("a reply in the served thread published %d inbound messages, want 1", got-inbound)
	}
	// Its result comes back into the same thread.
	res := r.slack.await(t, 2, "chat.postMessage", in("C1"))[1]
	if res.form.Get("thread_ts") != root || !strings.Contains(res.form.Get("text"), turnOf("C1", "1700000063.000100")) {
		t.Errorf("result of the reply: thread %q text %q", res.form.Get("thread_ts"), res.form.Get("text"))
	}
}

// The planner's reply event is delivered into the turn's thread once,
// however often it is stored; a planner step batch's outcome is not posted
// (the reply is what the user sees).
func TestPlannerReplyIsDeliveredOnceToTheThread(t *testing.T) {
	r := startRig(t)
	turn := turnOf("DU1", "1700000080.000100")
	reply := &schemas.ReplyEvent{TurnID: turn, SessionID: "s", Text: "Here is what I did.", Audience: schemas.AudiencePersonal,
		Reply: schemas.ReplyTarget{Transport: tgslack.Name, Channel: schemas.Channel{ID: "DU1", Kind: schemas.ChannelDM, Thread: "1700000080.000100"}},
		At:    time.Now().UTC()}
	step := &schemas.TurnOutcome{TurnID: schemas.PlannerStepTurnID(turn, 0), SessionID: "s", State: schemas.TurnCompleted,
		Audience: schemas.AudiencePersonal, Reply: reply.Reply, FinishedAt: time.Now().UTC()}
	r.h.Publish(topology.SubjectTurnOutcome+step.TurnID, "", step)
	r.h.Publish(topology.SubjectTurnReply+turn, "", reply)
	r.h.Publish(topology.SubjectTurnReply+turn, "", reply)
	// The reply is posted; once every event is consumed, it is still the
	// only post.
	r.slack.await(t, 1, "chat.postMessage", func(c call) bool { return c.form.Get("text") == reply.Text })
	r.awaitConsumed(t)
	posts := r.slack.find("chat.postMessage", in("DU1"))
	replies := r.slack.find("chat.postMessage", func(c call) bool { return c.form.Get("text") == reply.Text })
	if len(replies) != 1 || replies[0].form.Get("thread_ts") != "1700000080.000100" || len(posts) != 1 {
		t.Errorf("%d replies, %d posts in DU1; want the reply once, in the thread: %v", len(replies), len(posts), r.slack.methods())
	}
}

// The inbound message names the sender by workspace and user (the user's
// own workspace in a Slack Connect channel), verified, with the channel
// kind of the conversation and the thread as the session.
func TestInboundMessageIdentity(t *testing.T) {
	r := startRig(t)
	r.slack.convTypes["G7"] = "private"
	const ts = "1700000090.000100"
	r.event(t, "EvX", map[string]any{"type": "app_mention", "user": "U5", "user_team": "T2", "channel": "G7", "ts": ts, "text": "<@UBOT> hi there"})
	ctx, cancel := r.h.Ctx()
	defer cancel()
	s, err := r.h.JS.Stream(ctx, "TOLLGATE_INBOUND")
	if err != nil {
		t.Fatal(err)
	}
	session := "slack:" + team + ":G7:" + ts
	raw, err := s.GetLastMsgForSubject(ctx, topology.InboundSubject(tgslack.Name, session))
	if err != nil {
		t.Fatalf("no inbound message for the session: %v", err)
	}
	m, err := schemas.Decode[schemas.InboundMessage](raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	want := schemas.Sender{ID: "T2:U5", Kind: schemas.SenderUser, Verified: true}
	if m.Sender != want || m.Channel != (schemas.Channel{ID: "G7", Kind: schemas.ChannelPrivate, Thread: ts}) ||
		m.Text != "hi there" || m.MessageID != team+":G7:"+ts || m.SessionID != session {
		t.Errorf("inbound message: %+v", m)
	}
}

// A click is answered within Slack's 3 seconds even when the Slack call it
// leads to (views.open) is slow: that call runs after the answer.
func TestAnswerDoesNotWaitForSlowSlackCalls(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000100.000100"
	r.event(t, "EvSlow", dm("U1", ch, ts, "write slow.txt"))
	p := r.promptOf(t, schemas.ApprovalID(turnOf(ch, ts), 0))
	r.slack.mu.Lock()
	r.slack.delay["views.open"] = 4 * time.Second
	r.slack.mu.Unlock()
	start := time.Now()
	if resp := r.click(t, clickBody("U1", ch, p.ts, tgslack.ActionDeny, buttonValue(t, p, tgslack.ActionDeny), "8.1")); resp.StatusCode != 200 {
		t.Fatalf("click: %d", resp.StatusCode)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("answered after %v", el)
	}
	r.slack.await(t, 1, "views.open", nil)
}
