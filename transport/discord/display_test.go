package discord_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// A call holding invisible and direction-changing characters (every row
// of reveal.HostileExamples) is prompted with none raw and the warning
// line, each shown escaped (in full by Show arguments when folded).
func TestPromptShowsHostileCharactersEscaped(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "hostile")
	p := r.promptOf(t, id)
	if reveal.Contains(p.content()) || !strings.Contains(p.content(), reveal.Warning) {
		t.Errorf("the prompt holds a raw flagged character or no warning: %q", p.content())
	}
	shown := p.content()
	if strings.Contains(fmt.Sprint(p.body["components"]), "Show arguments") { // folded
		a := r.send(t, click("111", dmOf("111"), p.id, customID(t, p, "Show arguments")))
		if reveal.Contains(a.content()) || !strings.Contains(a.content(), reveal.Warning) {
			t.Errorf("the arguments hold a raw flagged character or no warning: %q", a.content())
		}
		shown = a.content()
	}
	for _, ex := range reveal.HostileExamples {
		if !strings.Contains(shown, ex.InJSON()) {
			t.Errorf("%s: the arguments do not show %s", ex.Name, ex.InJSON())
		}
	}
	plain := r.promptOf(t, r.askOK(t, "111", dmOf("111"), "write plain.txt"))
	if strings.Contains(plain.content(), reveal.Warning) {
		t.Errorf("a plain call's prompt warns: %q", plain.content())
	}
	// What the call would change, in short: write_file's preview of a file
	// that does not exist yet.
	if !strings.Contains(plain.content(), "change: `new file, 1 line`") {
		t.Errorf("a write_file prompt does not say what it would change: %q", plain.content())
	}
}

// Four or more backticks in an argument or a tool's output cannot close
// the code block; the planner's reply cannot disguise a link.
func TestChatMarkupIsInert(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", dmOf("111"), "write a````b```**bold**```"+"`")
	if c := r.promptOf(t, id).content(); strings.Count(c, "```") != 2 {
		t.Errorf("the prompt holds %d fences, want the code block's 2: %q", strings.Count(c, "```"), c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	target := schemas.ReplyTarget{Transport: discord.Name, Channel: schemas.Channel{ID: "C7", Kind: schemas.ChannelPublic}}
	if err := r.tr.DeliverReply(ctx, &schemas.ReplyEvent{TurnID: "t-reply", Audience: schemas.AudiencePublic, Reply: target,
		Text: "Done: [bank.com](http://evil.example) @everyone"}); err != nil {
		t.Fatal(err)
	}
	if err := r.tr.DeliverOutcome(ctx, &schemas.TurnOutcome{TurnID: "t-fence", State: schemas.TurnCompleted, Audience: schemas.AudiencePublic, Reply: target,
		Results: []schemas.ToolResult{{CallID: "c0", Tool: "echo", Status: schemas.ResultOK, Output: "````\n**bold** [x](http://evil.example)\n`"}}}); err != nil {
		t.Fatal(err)
	}
	reply := r.discord.find(http.MethodPost, "/channels/C7/", func(c call) bool { return strings.HasPrefix(c.content(), "Done:") })
	if len(reply) != 1 || strings.Contains(reply[0].content(), "](") {
		t.Errorf("reply %v: want one post without a masked link", reply)
	} else if m, _ := reply[0].body["allowed_mentions"].(map[string]any); m == nil || len(m["parse"].([]any)) != 0 {
		t.Errorf("reply allows mentions: %v", reply[0].body["allowed_mentions"])
	}
	out := r.discord.find(http.MethodPost, "/channels/C7/", func(c call) bool { return strings.Contains(c.content(), "t-fence") })
	if len(out) != 1 || strings.Count(out[0].content(), "```") != 2 {
		t.Errorf("outcome %v: want one post with the code block's 2 fences", out)
	}
}
