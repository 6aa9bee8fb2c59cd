package slack_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
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
