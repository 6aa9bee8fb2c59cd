package discord_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// The whole flow: /ask in a DM -> the prompt in the requester's DM with
// Approve / Deny -> a signed click -> the call runs -> the prompt is
// closed (the clicker's own click answered UPDATE_MESSAGE, or the bot
// token's edit) -> the result posted in the DM. The prompt shows the tool,
// the arguments, the digest, the requester and the expiry.
func TestAskApproveRunsTheCallAndClosesThePrompt(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "write flow.txt")
	p := r.promptOf(t, id)
	if p.channel() != "DM111" || p.auth != "Bot "+botToken {
		t.Fatalf("prompt went to %s with auth %q", p.channel(), p.auth)
	}
	ctx, cancel := r.h.Ctx()
	rec, _, err := r.h.Store.Approvals.Get(ctx, id)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"write_file", "flow.txt", rec.ArgsDigest, "discord:111", rec.ExpiresAt.UTC().Format(time.RFC3339)} {
		if !strings.Contains(p.content(), want) {
			t.Errorf("prompt lacks %q: %s", want, p.content())
		}
	}
	customDeny := customID(t, p, "Deny")
	a := r.send(t, click("111", dmOf("111"), p.id, customID(t, p, "Approve")))
	if a.status != 200 {
		t.Fatalf("click: %d", a.status)
	}
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	t.Logf("the click was answered type %d", a.typ)
	switch a.typ {
	case 7: // UPDATE_MESSAGE: the clicker's own click closed the prompt
		comps, _ := a.data["components"].([]any)
		if !strings.Contains(a.content(), "Approved") || !strings.Contains(a.content(), "discord:111") || len(comps) != 0 {
			t.Errorf("UPDATE_MESSAGE: %v", a.data)
		}
	case 6: // deferred: the bot token's edit closes it
		r.discord.await(t, 1, http.MethodPatch, "/channels/DM111/messages/"+p.id, func(c call) bool { return strings.Contains(c.content(), "Approved") })
	default:
		t.Fatalf("click answered type %d", a.typ)
	}
	res := r.discord.await(t, 2, http.MethodPost, "/channels/DM111/messages", nil)[1]
	if !strings.Contains(res.content(), "write_file") || !strings.Contains(res.content(), "completed") {
		t.Errorf("result: %s", res.content())
	}
	if b, err := os.ReadFile(filepath.Join(r.h.Sandbox, "flow.txt")); err != nil || string(b) != "from discord" {
		t.Errorf("the call did not run: %q %v", b, err)
	}
	// Deny on the decided prompt: ephemeral, nothing published.
	before := r.msgs(t, topology.StreamDecisions)
	a = r.send(t, click("111", dmOf("111"), p.id, customDeny))
	if a.typ != 4 || a.data["flags"] != float64(64) || !strings.Contains(a.content(), string(schemas.CodeApprovalAlreadyDecided)) {
		t.Errorf("click on a decided prompt: %+v", a)
	}
	if r.msgs(t, topology.StreamDecisions) != before {
		t.Error("a click on a decided prompt published a decision")
	}
}

// PING is answered PONG.
func TestPingIsAnsweredPong(t *testing.T) {
	r := startRig(t)
	if a := r.send(t, []byte(`{"id": "1", "type": 1, "application_id": "4000"}`)); a.status != 200 || a.typ != 1 {
		t.Fatalf("PING: %+v", a)
	}
}

// Deny closes the prompt as denied; the call never runs.
func TestDenyClosesThePrompt(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "write denied.txt")
	p := r.promptOf(t, id)
	a := r.send(t, click("111", dmOf("111"), p.id, customID(t, p, "Deny")))
	if a.status != 200 || (a.typ != 6 && a.typ != 7) {
		t.Fatalf("deny: %+v", a)
	}
	r.awaitStatus(t, id, schemas.ApprovalDenied)
	res := r.discord.await(t, 2, http.MethodPost, "/channels/DM111/messages", nil)[1]
	if !strings.Contains(res.content(), "denied") {
		t.Errorf("result: %s", res.content())
	}
	if _, err := os.Stat(filepath.Join(r.h.Sandbox, "denied.txt")); err == nil {
		t.Error("a denied call ran")
	}
}

// Deny with reason answers a modal bound to the approval; its submit
// denies with the reason as the decision's note, stored with the decision
// and shown, inert, in the closed prompt. A modal submit of any other
// custom_id publishes nothing.
func TestDenyWithReasonModalSendsTheNote(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "write reasoned.txt")
	p := r.promptOf(t, id)
	custom := customID(t, p, "Deny with reason…")
	a := r.send(t, click("111", dmOf("111"), p.id, custom))
	if a.status != 200 || a.typ != 9 || a.data["custom_id"] != custom {
		t.Fatalf("deny with reason: %+v, want a modal (type 9) with custom_id %s", a, custom)
	}
	rows, _ := a.data["components"].([]any)
	if len(rows) != 1 || !strings.Contains(fmt.Sprint(rows), "reason") {
		t.Fatalf("modal components: %v", rows)
	}
	if got := r.approvalStatus(t, id); got != schemas.ApprovalPending {
		t.Fatalf("opening the modal decided: %s", got)
	}
	const reason = "too risky <@&1> @everyone [bank](http://evil.example) ```x```"
	submit := func(customID string) answer {
		m := base(nextID(), 5, "111", dmOf("111"))
		m["data"] = map[string]any{"custom_id": customID, "components": []any{map[string]any{"type": 1,
			"components": []any{map[string]any{"type": 4, "custom_id": "reason", "value": reason}}}}}
		m["message"] = map[string]any{"id": p.id, "channel_id": "DM111"}
		b, _ := json.Marshal(m)
		return r.send(t, b)
	}
	if a := submit(customID(t, p, "Approve")); a.status != http.StatusBadRequest {
		t.Errorf("a modal submit naming Approve: %d, want 400", a.status)
	}
	a = submit(custom)
	if a.status != 200 || (a.typ != 6 && a.typ != 7) {
		t.Fatalf("submit: %+v", a)
	}
	r.awaitStatus(t, id, schemas.ApprovalDenied)
	if d := r.h.Approval(id).Decision; d == nil || d.Note != reason || d.Principal != "discord:111" {
		t.Fatalf("decision: %+v, want discord:111's with the note", d)
	}
	closed := a.content()
	if a.typ == 6 {
		closed = r.discord.await(t, 1, http.MethodPatch, "/channels/DM111/messages/"+p.id, nil)[0].content()
	}
	if !strings.Contains(closed, "Denied") || !strings.Contains(closed, "too risky") {
		t.Errorf("closed prompt: %q, want Denied and the note", closed)
	}
	// Inert: inside a code block the note cannot close, and mentions never ping.
	if strings.Count(closed, "```") != 2 || !strings.Contains(closed, "```\n"+chat.CodeBody(reason)) {
		t.Errorf("the note is not in one closed code block: %q", closed)
	}
	if _, err := os.Stat(filepath.Join(r.h.Sandbox, "reasoned.txt")); err == nil {
		t.Error("a denied call ran")
	}
}

// Long arguments are folded in the prompt; Show arguments answers the
// full text to the clicker alone, and decides nothing.
func TestFoldedArgumentsAreShownEphemerally(t *testing.T) {
	r := startRig(t)
	long := strings.Repeat("x", 2*discord.FoldArgs)
	id := r.askOK(t, "111", dmOf("111"), "write "+long)
	p := r.promptOf(t, id)
	if strings.Contains(p.content(), long) {
		t.Fatal("the prompt shows the long arguments unfolded")
	}
	before := r.msgs(t, topology.StreamDecisions)
	a := r.send(t, click("111", dmOf("111"), p.id, customID(t, p, "Show arguments")))
	if a.typ != 4 || a.data["flags"] != float64(64) || !strings.Contains(a.content(), long) {
		t.Errorf("show arguments: %+v", a)
	}
	if r.msgs(t, topology.StreamDecisions) != before || r.approvalStatus(t, id) != schemas.ApprovalPending {
		t.Error("showing the arguments decided something")
	}
}

// A decision taken elsewhere while the transport was down is shown when
// it comes back: the prompt is edited with the bot token, the result
// posted; replaying every stored event afterwards posts nothing twice.
func TestPromptsCatchUpAfterDowntimeAndNothingIsPostedTwice(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "write later.txt")
	p := r.promptOf(t, id)
	r.shutdown()
	r.h.Submit(r.h.Decision(id, schemas.OptionApprove, discord.Name, "111"))
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	if n := len(r.discord.find(http.MethodPatch, "/channels/", nil)); n != 0 {
		t.Fatalf("%d edits while the transport was down", n)
	}
	r.start(t)
	up := r.discord.await(t, 1, http.MethodPatch, "/channels/DM111/messages/"+p.id, nil)[0]
	if !strings.Contains(up.content(), "Approved") || up.auth != "Bot "+botToken {
		t.Errorf("closed prompt: %s (auth %q)", up.content(), up.auth)
	}
	r.discord.await(t, 2, http.MethodPost, "/channels/DM111/messages", nil)
	r.awaitConsumed(t)

	r.shutdown()
	r.start(t)
	replayAll(t, r)
	r.awaitConsumed(t)
	if n := len(r.discord.find(http.MethodPost, "/channels/", nil)); n != 2 {
		t.Errorf("%d posts after a restart and a replay of every event, want the prompt and the result: %s", n, r.discord.dump())
	}
	if n := len(r.discord.find(http.MethodPatch, "/channels/", nil)); n != 1 {
		t.Errorf("%d edits after the replay, want 1", n)
	}
}

// replayAll publishes every stored event again (without message ids, as a
// redelivery beyond the dedupe window would store them).
func replayAll(t *testing.T, r *rig) {
	t.Helper()
	ctx, cancel := r.h.Ctx()
	defer cancel()
	cons, err := r.h.JS.OrderedConsumer(ctx, topology.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n := r.msgs(t, topology.StreamEvents)
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if _, err := r.h.JS.Publish(ctx, m.Subject(), m.Data()); err != nil {
			t.Fatalf("replay: %v", err)
		}
	}
}

// A burst of posts into one channel answered 429 with Retry-After is
// delayed by it, in order, and none is lost.
func TestRateLimitedBurstIsDelayedNotLost(t *testing.T) {
	r := startRig(t)
	r.discord.mu.Lock()
	r.discord.limit429 = 2
	r.discord.mu.Unlock()
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
				Reply: schemas.ReplyTarget{Transport: discord.Name, Channel: schemas.Channel{ID: "C9", Kind: schemas.ChannelPublic}},
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
	posts := r.discord.find(http.MethodPost, "/channels/C9/messages", nil)
	if len(posts) != n || len(r.discord.find("429", "", nil)) != 2 {
		t.Fatalf("%d posts and %d 429s, want %d and 2", len(posts), len(r.discord.find("429", "", nil)), n)
	}
	for i := range n {
		want := fmt.Sprintf("t-burst%d", i)
		if c := r.discord.find(http.MethodPost, "/channels/C9/", func(c call) bool { return strings.Contains(c.content(), want) }); len(c) != 1 {
			t.Errorf("%s posted %d times", want, len(c))
		}
	}
	if el := time.Since(start); el < 2*time.Second {
		t.Errorf("the burst took %v: the Retry-After of two 429s (1s each) was not waited out", el)
	}
}

// The planner's reply event is delivered into the turn's channel once,
// however often it is stored; a planner step batch's outcome is not posted.
func TestPlannerReplyIsDeliveredOnce(t *testing.T) {
	r := startRig(t)
	turn := schemas.TurnID(discord.Name, "1299999999999999999")
	reply := &schemas.ReplyEvent{TurnID: turn, SessionID: "s", Text: "Here is what I did.", Audience: schemas.AudiencePersonal,
		Reply: schemas.ReplyTarget{Transport: discord.Name, Channel: schemas.Channel{ID: "DM111", Kind: schemas.ChannelDM}},
		At:    time.Now().UTC()}
	step := &schemas.TurnOutcome{TurnID: schemas.PlannerStepTurnID(turn, 0), SessionID: "s", State: schemas.TurnCompleted,
		Audience: schemas.AudiencePersonal, Reply: reply.Reply, FinishedAt: time.Now().UTC()}
	r.h.Publish(topology.SubjectTurnOutcome+step.TurnID, "", step)
	r.h.Publish(topology.SubjectTurnReply+turn, "", reply)
	r.h.Publish(topology.SubjectTurnReply+turn, "", reply)
	// The reply is posted; once every event is consumed, it is still the
	// only post.
	r.discord.await(t, 1, http.MethodPost, "/channels/DM111/messages", nil)
	r.awaitConsumed(t)
	posts := r.discord.find(http.MethodPost, "/channels/DM111/messages", nil)
	if len(posts) != 1 || posts[0].content() != reply.Text {
		t.Errorf("posts in DM111: %s; want the reply once", r.discord.dump())
	}
}

// The inbound message names the verified sender by user id, the channel
// as the session, and the channel kind by the documented rule: no guild
// is a DM; a private thread is private; a channel (or a public thread's
// parent) denying VIEW_CHANNEL to @everyone is private; any other, or one
// that cannot be read, is public.
func TestInboundMessageIdentityAndChannelKind(t *testing.T) {
	r := startRig(t)
	deny := func(id string, typ int, parent string, denyBits string) map[string]any {
		c := map[string]any{"id": id, "type": typ, "guild_id": guild, "parent_id": parent}
		if denyBits != "" {
			c["permission_overwrites"] = []any{map[string]any{"id": guild, "type": 0, "allow": "0", "deny": denyBits}}
		}
		return c
	}
	r.discord.mu.Lock()
	r.discord.chans["C-open"] = deny("C-open", 0, "", "2048")   // SEND_MESSAGES denied only
	r.discord.chans["C-staff"] = deny("C-staff", 0, "", "1024") // VIEW_CHANNEL denied
	r.discord.chans["T-staff"] = deny("T-staff", 11, "C-staff", "")
	r.discord.mu.Unlock()
	readable := func() {
		r.discord.mu.Lock()
		r.discord.chans["C-gone"] = deny("C-gone", 0, "", "1024")
		r.discord.mu.Unlock()
	}
	cases := []struct {
		name   string
		w      where
		want   schemas.ChannelKind
		before func()
	}{
		{"a DM is dm", dmOf("222"), schemas.ChannelDM, nil},
		{"a group DM is private", where{channel: "GDM1", typ: 3}, schemas.ChannelPrivate, nil},
		{"a channel everyone can see is public", where{guild: guild, channel: "C-open", typ: 0}, schemas.ChannelPublic, nil},
		{"a channel hidden from everyone is private", where{guild: guild, channel: "C-staff", typ: 0}, schemas.ChannelPrivate, nil},
		{"a public thread of a hidden channel is private", where{guild: guild, channel: "T-staff", typ: 11}, schemas.ChannelPrivate, nil},
		{"a private thread is private", where{guild: guild, channel: "T-priv", typ: 12}, schemas.ChannelPrivate, nil},
		{"an unreadable channel is public", where{guild: guild, channel: "C-gone", typ: 0}, schemas.ChannelPublic, nil},
		{"an unreadable channel is read again next time", where{guild: guild, channel: "C-gone", typ: 0}, schemas.ChannelPrivate, readable},
	}
	for _, c := range cases {
		if c.before != nil {
			c.before()
		}
		t.Run(c.name, func(t *testing.T) {
			body, id := ask("222", c.w, "  hello there ")
			if a := r.send(t, body); a.status != 200 || a.typ != 4 {
				t.Fatalf("/ask: %+v", a)
			}
			ctx, cancel := r.h.Ctx()
			defer cancel()
			s, err := r.h.JS.Stream(ctx, topology.StreamInbound)
			if err != nil {
				t.Fatal(err)
			}
			session := "discord:" + c.w.channel + ":" + id
			if c.w.typ >= 10 && c.w.typ <= 12 {
				session = "discord:" + c.w.channel
			}
			raw, err := s.GetLastMsgForSubject(ctx, topology.InboundSubject(discord.Name, session))
			if err != nil {
				t.Fatalf("no inbound message for the session: %v", err)
			}
			m, err := schemas.Decode[schemas.InboundMessage](raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			want := schemas.Sender{ID: "222", Kind: schemas.SenderUser, Verified: true}
			if m.Sender != want || m.Channel != (schemas.Channel{ID: c.w.channel, Kind: c.want}) ||
				m.Text != "hello there" || m.MessageID != id || m.Transport != discord.Name || m.SessionID != session {
				t.Errorf("inbound message: %+v", m)
			}
		})
	}
}

// The answer to /ask echoes the request without pinging anyone.
func TestAskAnswerPingsNoOne(t *testing.T) {
	r := startRig(t)
	body, _ := ask("111", dmOf("111"), "@everyone hi")
	a := r.send(t, body)
	am, _ := json.Marshal(a.data["allowed_mentions"])
	if a.typ != 4 || string(am) != `{"parse":[]}` {
		t.Errorf("answer: %+v", a)
	}
}

// /ask is answered within Discord's 3 seconds even when reading the
// channel's permissions hangs: the channel then counts as public.
func TestAskIsAnsweredInTimeWhenDiscordIsSlow(t *testing.T) {
	r := startRig(t)
	r.discord.mu.Lock()
	r.discord.slowGet = 10 * time.Second
	r.discord.mu.Unlock()
	w := where{guild: guild, channel: "C-slow", typ: 0}
	body, id := ask("111", w, "hello")
	start := time.Now()
	a := r.send(t, body)
	if el := time.Since(start); a.status != 200 || a.typ != 4 || el > 3*time.Second {
		t.Fatalf("answer %+v after %v", a, el)
	}
	ctx, cancel := r.h.Ctx()
	defer cancel()
	s, err := r.h.JS.Stream(ctx, topology.StreamInbound)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, topology.InboundSubject(discord.Name, "discord:C-slow:"+id))
	if err != nil {
		t.Fatalf("no inbound message: %v", err)
	}
	m, err := schemas.Decode[schemas.InboundMessage](raw.Data)
	if err != nil || m.Channel.Kind != schemas.ChannelPublic {
		t.Errorf("inbound message: %+v, %v", m, err)
	}
}

// A prompt shows each grant option's summary and a button of its own,
// bound to the approval and digest like Approve (custom_id "tg-g<index
// of the option>:<approval>:<digest prefix>"). A grant button whose index
// is not a grant option (approve's) is refused 400 and publishes nothing;
// the requester's click approves with the grant option and makes the
// grant; the requester's next call (another /ask) is decided by the
// grant, runs, and gets no prompt.
func TestGrantButtonApprovesAndGrants(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "131", dmOf("131"), "write g1.txt")
	p := r.promptOf(t, id)
	rec := r.h.WaitPending(id)
	offer, ok := rec.Offer("approve-day")
	if !ok || !strings.Contains(p.content(), offer.Summary) || !strings.Contains(p.content(), "1h0m0s") {
		t.Fatalf("the prompt does not say what the grant covers (%+v):\n%s", offer, p.content())
	}
	grant := customID(t, p, "approve-day")
	approveID := customID(t, p, "Approve")
	if !strings.HasPrefix(grant, discord.VerbGrantPrefix) || strings.SplitN(grant, ":", 2)[1] != strings.SplitN(approveID, ":", 2)[1] {
		t.Fatalf("grant button %q is not bound like approve's %q", grant, approveID)
	}

	before := r.msgs(t, topology.StreamDecisions)
	forged := discord.VerbGrantPrefix + "0:" + strings.SplitN(approveID, ":", 2)[1] // index 0 is approve
	if a := r.send(t, click("131", dmOf("131"), p.id, forged)); a.status != http.StatusBadRequest {
		t.Fatalf("a grant button naming approve: %d", a.status)
	}
	if r.msgs(t, topology.StreamDecisions) != before {
		t.Fatal("a refused grant click published a decision")
	}

	if a := r.send(t, click("131", dmOf("131"), p.id, grant)); a.status != 200 {
		t.Fatalf("grant click: %d", a.status)
	}
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	a := r.h.Approval(id)
	if a.Decision.Option != "approve-day" || a.Decision.Principal != "discord:131" {
		t.Fatalf("decision %+v", a.Decision)
	}
	gid := schemas.GrantID(id, a.Decision.DecisionID)
	r.h.WaitGrant(gid)

	second := r.askOK(t, "131", dmOf("131"), "write g2.txt")
	if out := r.h.WaitOutcome(schemas.TurnIDOfApproval(second)); out.State != schemas.TurnCompleted {
		t.Fatalf("second turn %s", out.State)
	}
	if d := r.h.Approval(second).Decision; d == nil || d.Grant == nil || d.Grant.GrantID != gid {
		t.Fatalf("second call decided by %+v, want grant %s", d, gid)
	}
	// Its result is posted (after its events were handled): no prompt.
	r.discord.await(t, 2, http.MethodPost, "/channels/DM131/messages", func(c call) bool { return strings.Contains(c.content(), "completed") })
	for _, c := range r.discord.find(http.MethodPost, "/channels/DM131/messages", nil) {
		if strings.Contains(c.content(), second) {
			t.Fatalf("the grant-decided call was prompted: %s", c.content())
		}
	}
}
