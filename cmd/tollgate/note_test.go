package main

import (
	"encoding/json"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestTheDecisionNoteIsShown: a deny sent with a reason is kept with the
// decision, and show, outcome and audit print it (its hidden characters
// escaped, as every field a person reads), their --json forms carry it as
// sent.
func TestTheDecisionNoteIsShown(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	turn := h.Send(h.Inbound("s-note", "alice", pt.Call("write_file", `{"path":"notes/a.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	const note = "wrong file: use notes/b.txt \u202e"
	d := h.Decision(id, schemas.OptionDeny, "cli", "alice")
	d.Note = note
	h.Submit(d)
	h.WaitTerminal(turn)
	shown := `wrong file: use notes/b.txt \u202E`

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"show", []string{"show", id}, "note       " + shown},
		{"outcome", []string{"outcome", turn}, `cli:alice (deny, note "` + shown + `")`},
		{"audit", []string{"audit", "--turn", turn}, `denied (deny, assurance 1), note "` + shown + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append(tc.args, url)...)
			if code != 0 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %q in:\n%s", code, errOut, tc.want, out)
			}
			if strings.ContainsRune(out, '\u202e') {
				t.Fatalf("the note's U+202E reached the terminal:\n%s", out)
			}
		})
	}
	t.Run("show --json", func(t *testing.T) {
		code, out, _ := runCLI(t, "show", id, url, "--json")
		var got struct {
			Decision struct {
				Note string `json:"note"`
			} `json:"decision"`
		}
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.Decision.Note != note {
			t.Fatalf("exit %d, %v, note %q:\n%s", code, err, got.Decision.Note, out)
		}
	})
}
