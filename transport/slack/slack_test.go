package slack_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat/chattest"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// A DM asks for a call that needs approval: the prompt goes to the DM's
// thread, the requester's signed click approves it, the call runs, the
// prompt is updated in place (no buttons, who and when), and the result
// arrives in the thread.
func TestDMTurnPromptClickRunUpdateResult(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000000.000100"
	if resp := r.event(t, "Ev1", dm("U1", ch, ts, "write dm.txt")); resp.StatusCode != http.StatusOK {
		t.Fatalf("event: %d", resp.StatusCode)
	}
	turn := turnOf(ch, ts)
	approval := schemas.ApprovalID(turn, 0)

	prompt := r.slack.await(t, 1, "chat.postMessage", in(ch))[0]
	chattest.Prompted(t, r.h.JS, tgslack.Name, approval) // see promptOf
	if prompt.form.Get("thread_ts") != ts {
		t.Errorf("prompt thread_ts = %q, want the message's %q", prompt.form.Get("thread_ts"), ts)
	}
	for _, want := range []string{"write_file", "dm.txt", "sha256:", "slack:T1:U1", "Approve", "Deny"} {
		if !strings.Contains(prompt.form.Get("blocks"), want) {
			t.Errorf("prompt blocks lack %q: %s", want, prompt.form.Get("blocks"))
		}
	}
	value := buttonValue(t, prompt, tgslack.ActionApprove)
	if !strings.HasPrefix(value, approval+" ") {
		t.Fatalf("button value %q does not name %s", value, approval)
	}
	if resp := r.click(t, clickBody("U1", ch, prompt.ts, tgslack.ActionApprove, value, "1.1")); resp.StatusCode != http.StatusOK {
		t.Fatalf("click: %d", resp.StatusCode)
	}
	r.awaitStatus(t, approval, schemas.ApprovalApproved)

	update := r.slack.await(t, 1, "chat.update", in(ch))[0]
	if update.form.Get("ts") != prompt.ts {
		t.Errorf("chat.update ts = %q, want the prompt's", update.form.Get("ts"))
	}
	blocks := update.form.Get("blocks")
	if strings.Contains(blocks, tgslack.ActionApprove) || !strings.Contains(blocks, "Approved") || !strings.Contains(blocks, "slack:T1:U1") {
		t.Errorf("updated prompt should show who approved, without buttons: %s", blocks)
	}

	result := r.slack.await(t, 2, "chat.postMessage", in(ch))[1]
	if result.form.Get("thread_ts") != ts || !strings.Contains(result.form.Get("text"), "write_file") || !strings.Contains(result.form.Get("text"), "ok") {
		t.Errorf("result: thread %q text %q", result.form.Get("thread_ts"), result.form.Get("text"))
	}
	if b, err := os.ReadFile(filepath.Join(r.h.Sandbox, "dm.txt")); err != nil || string(b) != "from slack" {
		t.Errorf("the approved call did not run: %q, %v", b, err)
	}

	// A click on the decided prompt publishes nothing and tells why.
	decisions := r.msgs(t, "TOLLGATE_DECISIONS")
	if resp := r.click(t, clickBody("U1", ch, prompt.ts, tgslack.ActionApprove, value, "1.2")); resp.StatusCode != http.StatusOK {
		t.Fatalf("late click: %d", resp.StatusCode)
	}
	r.slack.await(t, 1, "chat.postEphemeral", func(c call) bool {
		return c.form.Get("user") == "U1" && strings.Contains(c.form.Get("text"), string(schemas.CodeApprovalAlreadyDecided))
	})
	if got := r.msgs(t, "TOLLGATE_DECISIONS"); got != decisions {
		t.Errorf("a click on a decided prompt published %d decisions", got-decisions)
	}

	// A restart replays nothing twice: the same events again post nothing.
	posts, updates := len(r.slack.find("chat.postMessage", nil)), len(r.slack.find("chat.update", nil))
	r.shutdown()
	r.start(t)
	replayAll(t, r)
	r.awaitConsumed(t)
	if got := len(r.slack.find("chat.postMessage", nil)); got != posts {
		t.Errorf("after a restart and a replay: %d posts, want %d", got, posts)
	}
	if got := len(r.slack.find("chat.update", nil)); got != updates {
		t.Errorf("after a restart and a replay: %d updates, want %d", got, updates)
	}
}

// A DM's text goes through the planner: the model's write_file is prompted
// in the DM thread, a signed click approves it, the call runs, the prompt
// is updated, and the model's answer is the reply in the thread.
func TestDMTurnThroughThePlanner(t *testing.T) {
	model := plannertest.New(t)
	model.Script("save a note saying buy milk",
		plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"note.txt","content":"buy milk"}`}}},
		plannertest.Reply{Text: "Saved."})
	r := startPlannerRig(t, model)
	const ch, ts = "DU1", "1700000100.000100"
	if resp := r.event(t, "Ev-planner", dm("U1", ch, ts, "save a note saying buy milk")); resp.StatusCode != http.StatusOK {
		t.Fatalf("event: %d", resp.StatusCode)
	}
	turn := turnOf(ch, ts)
	approval := schemas.ApprovalID(schemas.PlannerStepTurnID(turn, 0), 0)

	prompt := r.slack.await(t, 1, "chat.postMessage", in(ch))[0]
	chattest.Prompted(t, r.h.JS, tgslack.Name, approval) // see promptOf
	if prompt.form.Get("thread_ts") != ts || !strings.Contains(prompt.form.Get("blocks"), "note.txt") {
		t.Fatalf("prompt in thread %q: %s", prompt.form.Get("thread_ts"), prompt.form.Get("blocks"))
	}
	value := buttonValue(t, prompt, tgslack.ActionApprove)
	if !strings.HasPrefix(value, approval+" ") {
		t.Fatalf("button value %q does not name the step's approval %s", value, approval)
	}
	if resp := r.click(t, clickBody("U1", ch, prompt.ts, tgslack.ActionApprove, value, "2.1")); resp.StatusCode != http.StatusOK {
		t.Fatalf("click: %d", resp.StatusCode)
	}
	r.awaitStatus(t, approval, schemas.ApprovalApproved)
	if update := r.slack.await(t, 1, "chat.update", in(ch))[0]; update.form.Get("ts") != prompt.ts {
		t.Errorf("chat.update ts = %q, want the prompt's", update.form.Get("ts"))
	}
	reply := r.slack.await(t, 1, "chat.postMessage", func(c call) bool { return c.form.Get("text") == "Saved." })[0]
	if reply.form.Get("channel") != ch || reply.form.Get("thread_ts") != ts {
		t.Errorf("reply in %q thread %q, want the DM's thread", reply.form.Get("channel"), reply.form.Get("thread_ts"))
	}
	if b, err := os.ReadFile(filepath.Join(r.h.Sandbox, "note.txt")); err != nil || string(b) != "buy milk" {
		t.Errorf("the approved call did not run: %q, %v", b, err)
	}
	if reqs := model.Requests("save a note saying buy milk"); len(reqs) != 2 || len(reqs[1].ToolResults()) != 1 {
		t.Errorf("model asked %d times (want 2, the second with the call's result)", len(reqs))
	}
}

// grantButton is the action id and value of the grant option button of a
// posted prompt (a section's accessory), and the section's text.
func grantButton(t *testing.T, c call, option string) (actionID, value, text string) {
	t.Helper()
	var blocks []struct {
		Text      struct{ Text string } `json:"text"`
		Accessory struct {
			ActionID string `json:"action_id"`
			Value    string `json:"value"`
		} `json:"accessory"`
	}
	if err := json.Unmarshal([]byte(c.form.Get("blocks")), &blocks); err != nil {
		t.Fatalf("prompt blocks: %v", err)
	}
	for _, b := range blocks {
		if b.Accessory.ActionID == tgslack.ActionGrantPrefix+option {
			return b.Accessory.ActionID, b.Accessory.Value, b.Text.Text
		}
	}
	t.Fatalf("prompt has no %s button: %s", option, c.form.Get("blocks"))
	return "", "", ""
}

// A prompt shows each grant option's summary with its own button, bound
// to the approval and digest like Approve. A click naming an option the
// prompt did not offer is refused (400) and publishes nothing; the
// requester's click on the grant button approves with that option and
// makes the grant; the next call of the session (a reply in the DM's
// thread) is decided by the grant, runs, and gets no prompt.
func TestGrantButtonApprovesAndGrants(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU7", "1700000000.000700"
	if resp := r.event(t, "EvG1", dm("U7", ch, ts, "write g1.txt")); resp.StatusCode != http.StatusOK {
		t.Fatalf("event: %d", resp.StatusCode)
	}
	turn := turnOf(ch, ts)
	approval := schemas.ApprovalID(turn, 0)
	prompt := r.promptOf(t, approval)
	rec := r.h.WaitPending(approval)
	offer, ok := rec.Offer("approve-session")
	if !ok {
		t.Fatalf("no offer: %+v", rec.Grants)
	}
	action, value, text := grantButton(t, prompt, "approve-session")
	if value != buttonValue(t, prompt, tgslack.ActionApprove) || !strings.Contains(text, "in this session") || !strings.Contains(text, "1h0m0s") || !strings.Contains(offer.Summary, "in this session") {
		t.Fatalf("grant button %q %q: %q (offer %q)", action, value, text, offer.Summary)
	}

	if resp := r.click(t, clickBody("U7", ch, prompt.ts, tgslack.ActionGrantPrefix+"approve-forever", value, "7.1")); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a click on an option not offered: %d", resp.StatusCode)
	}
	if n := len(r.h.Messages(topology.StreamDecisions, topology.DecisionSubject(tgslack.Name, approval))); n != 0 {
		t.Fatalf("%d decisions published for an option not offered", n)
	}

	if resp := r.click(t, clickBody("U7", ch, prompt.ts, action, value, "7.2")); resp.StatusCode != http.StatusOK {
		t.Fatalf("grant click: %d", resp.StatusCode)
	}
	r.awaitStatus(t, approval, schemas.ApprovalApproved)
	a := r.h.Approval(approval)
	if a.Decision.Option != "approve-session" || a.Decision.Principal != "slack:T1:U7" {
		t.Fatalf("decision %+v", a.Decision)
	}
	gid := schemas.GrantID(approval, a.Decision.DecisionID)
	jstest.Eventually(t, jstest.Wait, "grant "+gid, func() bool {
		ctx, cancel := r.h.Ctx()
		defer cancel()
		g, _, err := r.h.Store.Grants.Get(ctx, gid)
		return err == nil && g.Principal == "slack:T1:U7"
	})
	r.h.WaitOutcome(turn)

	reply := dm("U7", ch, "1700000000.000701", "write g2.txt")
	reply["thread_ts"] = ts
	if resp := r.event(t, "EvG2", reply); resp.StatusCode != http.StatusOK {
		t.Fatalf("event: %d", resp.StatusCode)
	}
	second := turnOf(ch, "1700000000.000701")
	if out := r.h.WaitOutcome(second); out.State != schemas.TurnCompleted {
		t.Fatalf("second turn %s", out.State)
	}
	if d := r.h.Approval(schemas.ApprovalID(second, 0)).Decision; d == nil || d.Grant == nil || d.Grant.GrantID != gid {
		t.Fatalf("second call decided by %+v, want grant %s", d, gid)
	}
	// Both results reach the thread; the events before the second's
	// (its approval, decided) were handled by then.
	r.slack.await(t, 2, "chat.postMessage", func(c call) bool {
		return c.form.Get("thread_ts") == ts && !strings.HasPrefix(c.form.Get("text"), "Approval needed")
	})
	for _, c := range r.slack.find("chat.postMessage", nil) {
		if strings.Contains(c.form.Get("blocks"), schemas.ApprovalID(second, 0)) {
			t.Fatalf("the grant-decided call was prompted: %s", c.form.Get("blocks"))
		}
	}
}
