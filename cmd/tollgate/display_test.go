package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate"
	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// escapes is tool output and a model reply that would drive a terminal:
// set the window title, clear the screen, hide text, a C1 CSI.
const escapes = "\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden\x1b[0m\u009b31m\rover"

// noControls fails if s holds a control character other than \n and \t.
func noControls(t *testing.T, what, s string) {
	t.Helper()
	if i := strings.IndexFunc(s, func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f }); i >= 0 {
		t.Errorf("%s writes control character %q to the terminal:\n%q", what, s[i:], s)
	}
}

// TestCLIShowsHostileCharactersEscaped: pending, show and outcome show a
// call holding every row of reveal.HostileExamples with each escaped,
// none raw, and the warning; --json stays exact.
func TestCLIShowsHostileCharactersEscaped(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	turn := h.Send(h.Inbound("s-hostile", "alice", pt.Call("write_file", reveal.HostileArgs())))
	id := schemas.ApprovalID(turn, 0)
	a := h.WaitPending(id)
	for _, args := range [][]string{{"pending"}, {"show", id}, {"outcome", turn}} {
		code, out, errOut := runCLI(t, append(args, url)...)
		if code != 0 && code != exitTimedOut {
			t.Fatalf("%s: exit %d, stderr %q", args[0], code, errOut)
		}
		if reveal.Contains(out) || !strings.Contains(out, reveal.Warning) {
			t.Errorf("%s holds a raw flagged character or no warning:\n%q", args[0], out)
		}
		if args[0] != "show" {
			continue
		}
		for _, ex := range reveal.HostileExamples {
			if !strings.Contains(out, ex.InJSON()) {
				t.Errorf("show: %s: does not show %s", ex.Name, ex.InJSON())
			}
		}
	}
	code, out, _ := runCLI(t, "show", id, url, "--json")
	var got struct {
		Args string `json:"args"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.Args != a.Args {
		t.Fatalf("show --json: exit %d, %v, args %q; want the exact %q", code, err, got.Args, a.Args)
	}
	// A plain call has no warning.
	plain := h.Send(h.Inbound("s-plain", "alice", pt.Call("write_file", `{"path":"p.txt","content":"p"}`)))
	h.WaitPending(schemas.ApprovalID(plain, 0))
	_, out, _ = runCLI(t, "show", schemas.ApprovalID(plain, 0), url)
	if strings.Contains(out, reveal.Warning) {
		t.Errorf("show warns about a plain call:\n%s", out)
	}
	if !strings.Contains(out, "preview (as of ") || !strings.Contains(out, "new file, 1 line\n  p\n") {
		t.Errorf("show does not show the preview (new file p.txt):\n%s", out)
	}
}

// TestOutcomeAndChatNeutraliseTerminalEscapes: tool output and a model's
// reply holding escape sequences reach the terminal escaped, in outcome
// and in chat; outcome --json keeps the output exact.
func TestOutcomeAndChatNeutraliseTerminalEscapes(t *testing.T) {
	model := plannertest.New(t)
	esc, _ := json.Marshal(map[string]string{"text": escapes})
	model.Script("hi",
		plannertest.Reply{Calls: []plannertest.Call{{Name: "echo", Args: string(esc)}}},
		plannertest.Reply{Text: "done " + escapes})
	opts := planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted", Timeout: 10 * time.Second}}
	h := pt.Start(t, pt.Options{Planner: &opts, Stages: append(slices.Clone(tollgate.AllStages()), tollgate.StagePlanner)})
	url := "--nats=" + h.Env.URL()

	turn := h.Send(h.Inbound("s-esc", "alice", pt.Call("echo", string(esc))))
	h.WaitTerminal(turn)
	code, out, errOut := runCLI(t, "outcome", turn, url)
	if code != 0 || !strings.Contains(out, `\u001B[2J`) {
		t.Fatalf("outcome: exit %d, stderr %q, out %q: want the escape shown", code, errOut, out)
	}
	noControls(t, "outcome", out)
	code, out, _ = runCLI(t, "outcome", turn, url, "--json")
	var got struct {
		Results []struct {
			Output string `json:"output"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Results) != 1 || got.Results[0].Output != escapes {
		t.Fatalf("outcome --json: exit %d, %v, %+v: want the exact output", code, err, got)
	}

	// chat refuses while the planner's consumer does not exist yet: the
	// stages start in the background.
	h.WaitConsuming()
	code, out, errOut = runCLI(t, "chat", "--session", "s-chat", "--sender", "alice", "--answer=false", "--wait", "20s", url, "hi")
	if code != 0 || !strings.Contains(out, `assistant: done \u001B]0;pwned\u0007`) || !strings.Contains(out, `echo: ok \u001B]0;pwned`) {
		t.Fatalf("chat: exit %d, stderr %q:\n%q", code, errOut, out)
	}
	noControls(t, "chat", out)
}

// TestChatPromptShowsHostileCharactersEscaped: chat's approval prompt
// and watch's line show a hostile call escaped, with the warning.
func TestChatPromptShowsHostileCharactersEscaped(t *testing.T) {
	args, _, err := schemas.CanonicalArgs(reveal.HostileArgs())
	if err != nil {
		t.Fatal(err)
	}
	rec := &schemas.ApprovalRecord{ApprovalID: "a-1-0", TurnID: "t-1", CallID: "c0", Tool: "write_file", Args: args,
		ArgsDigest: schemas.ArgsDigest(args), Options: []string{"approve", "deny"}, Status: schemas.ApprovalPending, RequestedAt: time.Now().UTC()}
	data, err := schemas.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v := &chatView{out: &out}
	v.show(context.Background(), "t-1", topology.SubjectApprovalRequested+"a-1-0", data)
	if reveal.Contains(out.String()) || !strings.Contains(out.String(), reveal.Warning) {
		t.Errorf("chat's prompt holds a raw flagged character or no warning:\n%q", out.String())
	}
	if line := summary(topology.SubjectApprovalRequested+"a-1-0", data); reveal.Contains(line) || !strings.Contains(line, reveal.Warning) {
		t.Errorf("watch's line holds a raw flagged character or no warning: %q", line)
	}
}
