package slack_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// A call holding invisible and direction-changing characters (every row
// of reveal.HostileExamples) is prompted with each shown escaped, none
// raw, and the warning line.
func TestPromptShowsHostileCharactersEscaped(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000200.000100"
	r.event(t, "EvH", dm("U1", ch, ts, "hostile"))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	shown := texts(t, p.form.Get("blocks"))
	if reveal.Contains(shown) || !strings.Contains(shown, reveal.Warning) {
		t.Errorf("the prompt holds a raw flagged character or no warning: %q", shown)
	}
	for _, ex := range reveal.HostileExamples {
		if !strings.Contains(shown, ex.InJSON()) {
			t.Errorf("%s: the prompt does not show %s", ex.Name, ex.InJSON())
		}
	}
	// Folded, the full arguments open in a modal: escaped, with the warning.
	long := strings.Repeat("x", 2*tgslack.FoldArgs) + "\u202E.sh"
	r.event(t, "EvL", dm("U1", ch, "1700000202.000100", "write "+long))
	lp := r.promptOf(t, schemas.ApprovalID(turnOf(ch, "1700000202.000100"), 0))
	if resp := r.click(t, clickBody("U1", ch, lp.ts, tgslack.ActionArgs, buttonValue(t, lp, tgslack.ActionArgs), "7.1")); resp.StatusCode != 200 {
		t.Fatalf("click: %d", resp.StatusCode)
	}
	open, _ := json.Marshal(r.slack.await(t, 1, "views.open", nil)[0].json)
	var view struct {
		View json.RawMessage `json:"view"`
	}
	_ = json.Unmarshal(open, &view)
	if modal := texts(t, string(view.View)); reveal.Contains(modal) || !strings.Contains(modal, reveal.Warning) || !strings.Contains(modal, `x\u202E.sh`) {
		t.Errorf("the arguments modal holds a raw flagged character, no warning or not the escape: %q", modal)
	}
	// A plain call has no warning.
	r.event(t, "EvP", dm("U1", ch, "1700000201.000100", "write plain.txt"))
	b := r.promptOf(t, schemas.ApprovalID(turnOf(ch, "1700000201.000100"), 0)).form.Get("blocks")
	if strings.Contains(b, reveal.Warning) {
		t.Errorf("a plain call's prompt warns: %s", b)
	}
	// What the call would change, in short: write_file's preview of a file
	// that does not exist yet.
	if !strings.Contains(texts(t, b), "change: new file, 1 line") {
		t.Errorf("a write_file prompt does not say what it would change: %s", b)
	}
}

// Four or more backticks in an argument or a tool's output cannot close
// the prompt's or the outcome's code block; the planner's reply can
// neither mention the channel nor disguise a link.
func TestChatMarkupIsInert(t *testing.T) {
	r := startRig(t)
	const ch, ts = "DU1", "1700000210.000100"
	r.event(t, "EvF", dm("U1", ch, ts, "write a````b```<!channel>```"+"`"))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	var blocks []struct {
		Text struct{ Text string } `json:"text"`
	}
	if err := json.Unmarshal([]byte(p.form.Get("blocks")), &blocks); err != nil {
		t.Fatal(err)
	}
	section := blocks[0].Text.Text
	if n := strings.Count(section, "```"); n != 2 {
		t.Errorf("the prompt's section holds %d fences, want the code block's 2: %q", n, section)
	}
	if strings.Contains(section, "<!channel>") {
		t.Errorf("the prompt holds a live mention: %q", section)
	}

	turn := turnOf("DU1", "1700000211.000100")
	reply := &schemas.ReplyEvent{TurnID: turn, SessionID: "s", Audience: schemas.AudiencePersonal,
		Text:  "Done. <!channel> <!everyone> see <http://evil.example|bank.com> & *this*",
		Reply: schemas.ReplyTarget{Transport: tgslack.Name, Channel: schemas.Channel{ID: "DU1", Kind: schemas.ChannelDM, Thread: "1700000211.000100"}},
		At:    time.Now().UTC()}
	r.h.Publish(topology.SubjectTurnReply+turn, "", reply)
	got := r.slack.await(t, 1, "chat.postMessage", func(c call) bool { return strings.HasPrefix(c.form.Get("text"), "Done.") })[0].form.Get("text")
	if want := "Done. &lt;!channel&gt; &lt;!everyone&gt; see &lt;http://evil.example|bank.com&gt; &amp; *this*"; got != want {
		t.Errorf("reply posted as %q, want %q", got, want)
	}

	out := &schemas.TurnOutcome{TurnID: turnOf("DU1", "1700000212.000100"), SessionID: "s", State: schemas.TurnCompleted,
		Audience: schemas.AudiencePersonal, FinishedAt: time.Now().UTC(),
		Reply:   schemas.ReplyTarget{Transport: tgslack.Name, Channel: schemas.Channel{ID: "DU1", Kind: schemas.ChannelDM, Thread: "1700000212.000100"}},
		Results: []schemas.ToolResult{{CallID: "c0", Tool: "echo", Status: schemas.ResultOK, Output: "````\n<!here> *bold*\n`"}}}
	r.h.Publish(topology.SubjectTurnOutcome+out.TurnID, "", out)
	text := r.slack.await(t, 1, "chat.postMessage", func(c call) bool { return strings.Contains(c.form.Get("text"), out.TurnID) })[0].form.Get("text")
	if n := strings.Count(text, "```"); n != 2 || strings.Contains(text, "<!here>") {
		t.Errorf("outcome %q: %d fences (want 2) or a live mention", text, n)
	}
}

// texts is the text of every block of a posted blocks JSON, decoded.
func texts(t *testing.T, blocks string) string {
	var decoded any
	if err := json.Unmarshal([]byte(blocks), &decoded); err != nil {
		t.Fatalf("blocks %q: %v", blocks, err)
	}
	var b strings.Builder
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["text"].(string); ok {
				b.WriteString(s + "\n")
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(decoded)
	return b.String()
}
