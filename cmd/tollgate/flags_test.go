package main

import (
	"slices"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestFlagsMayFollowPositionalArguments(t *testing.T) {
	cmd := &command{name: "approve"}
	fs := cmd.flags()
	as := fs.String("as", "", "")
	asJSON := fs.Bool("json", false, "")
	pos, _, ok := cmd.parse(fs, []string{"a-123-0", "--as", "alice", "--json"})
	if !ok || !slices.Equal(pos, []string{"a-123-0"}) || *as != "alice" || !*asJSON {
		t.Fatalf("pos %v ok %v as %q json %v", pos, ok, *as, *asJSON)
	}
}

func TestCallFlagParsesToolAndArguments(t *testing.T) {
	var c callFlags
	for _, v := range []string{`echo={"text":"a=b"}`, "noargs"} {
		if err := c.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	want := callFlags{{Tool: "echo", Args: `{"text":"a=b"}`}, {Tool: "noargs", Args: ""}}
	if !slices.Equal(c, want) {
		t.Fatalf("calls %+v, want %+v", c, want)
	}
	if err := c.Set(`={"x":1}`); err == nil {
		t.Fatal("a call without a tool name was accepted")
	}
}

func TestSummaryNamesTheEventAndItsKeyFacts(t *testing.T) {
	turn := schemas.TurnID("cli", "m1")
	data, err := schemas.Encode(&schemas.DecisionRejected{DecisionID: "d-1", ApprovalID: schemas.ApprovalID(turn, 0), Code: schemas.CodeDeciderNotAuthorized, Reason: "nope"})
	if err != nil {
		t.Fatal(err)
	}
	got := summary("tollgate.event.decision.rejected."+schemas.ApprovalID(turn, 0), data)
	if got != "decision d-1 rejected: DECIDER_NOT_AUTHORIZED: nope" {
		t.Fatalf("summary %q", got)
	}
	if got := summary("tollgate.event.other", []byte{1, 2, 3}); got != "3 bytes" {
		t.Fatalf("summary of an unknown event %q", got)
	}
}
