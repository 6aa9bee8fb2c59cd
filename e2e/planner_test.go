package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestPlannerEndToEnd runs the planner as its own process (ingest with
// --plan) against a scripted chat-completions server, and drives it with
// `tollgate chat` and the CLI.
func TestPlannerEndToEnd(t *testing.T) {
	bin := buildBinaries(t)
	model := plannertest.New(t)
	c := newCluster(t, bin)
	kill(t, c.stage("ingest"))
	c.startStage(t, "ingest", "--plan")
	planner := func() *proc {
		return c.startStage(t, "planner", "--llm-url", model.URL, "--llm-model", "scripted", "--llm-timeout", "10s")
	}
	p := planner()

	t.Run("chat_with_an_approval", func(t *testing.T) {
		text := "e2e: save a note saying buy milk"
		model.Script(text,
			plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"e2e-note.txt","content":"buy milk"}`}}},
			plannertest.Reply{Text: "Saved."})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "tollgate"), "chat", "--session", "e2e-chat", "--sender", "alice", "--nats", c.url, text)
		cmd.Env = childproc.Env()
		cmd.Stdin = strings.NewReader("a\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tollgate chat: %v\n%s", err, out)
		}
		for _, want := range []string{"approval needed: write_file", "approval approved", "assistant: Saved."} {
			if !strings.Contains(string(out), want) {
				t.Fatalf("chat output lacks %q:\n%s", want, out)
			}
		}
		if b, err := os.ReadFile(filepath.Join(c.sbox, "e2e-note.txt")); err != nil || string(b) != "buy milk" {
			t.Fatalf("note: %q, %v", b, err)
		}
	})

	t.Run("planner_killed_while_the_approval_waits", func(t *testing.T) {
		text := "e2e: save another note"
		model.Script(text,
			plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"e2e-restart.txt","content":"x"}`}}},
			plannertest.Reply{Text: "Saved again."})
		var sent struct {
			TurnID string `json:"turn_id"`
		}
		c.cliJSON(t, 0, &sent, "send", "--session", "e2e-restart", "--sender", "alice", "--text", text)
		approval := schemas.ApprovalID(schemas.PlannerStepTurnID(sent.TurnID, 0), 0)
		jstest.EventuallyState(t, jstest.LongWait, "the approval is requested", func() (bool, string) {
			r := c.runCLI(t, "pending", "--json")
			return strings.Contains(r.stdout, approval), r.stdout
		})
		kill(t, p)
		if r := c.runCLI(t, "approve", approval, "--as", "alice"); r.code != 0 {
			t.Fatalf("approve: %s", r)
		}
		p = planner()
		jstest.EventuallyState(t, jstest.LongWait, "the reply", func() (bool, string) {
			return c.streamCount(t, "TOLLGATE_EVENTS", "tollgate.event.turn.reply."+sent.TurnID) == 1, "no reply yet"
		})
		if n := len(model.Requests(text)); n != 2 {
			t.Fatalf("%d model requests, want 2: the recorded step is not asked again", n)
		}
	})
}
