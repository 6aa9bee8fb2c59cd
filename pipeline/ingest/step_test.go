package ingest_test

import (
	"fmt"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// stepOf is a step batch of planner turn root as the planner makes it: one
// echo call, root's context unchanged.
func stepOf(t *testing.T, root string, tc *schemas.TurnContext, index int) *schemas.AcceptedTurn {
	t.Helper()
	id := schemas.PlannerStepTurnID(root, index)
	canon, digest, err := schemas.CanonicalArgs(`{"text":"step"}`)
	if err != nil {
		t.Fatal(err)
	}
	return &schemas.AcceptedTurn{
		TurnID: id, Context: tc, Text: "step", Origin: root, AcceptedAt: time.Now().UTC(),
		Calls: []schemas.ToolCall{{CallID: schemas.CallID(id, 0), Tool: "echo", Args: canon, ArgsDigest: digest}},
	}
}

// A step batch reaches the accepted subject only through ingest, and only
// as the planner turn's own work under the context ingest sealed for it:
// anything else published on the step subject is dead-lettered by ingest
// and never becomes an accepted turn.
func TestStepBatchesReachTheExecutorOnlyThroughIngestsCheck(t *testing.T) {
	model := plannertest.New(t)
	h := pt.Start(t, pt.Options{Policy: ingestPolicy, Planner: &planner.Options{
		Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted"},
	}})
	m := h.Inbound("steps", "alice")
	m.Calls = nil
	root := h.Accept(m)
	other := h.Accept(h.Inbound("steps", "alice")) // another turn of the session, sealed
	foreign, err := seal.New("k-other", map[string][]byte{"k-other": []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	ctxWith := func(mutate func(*schemas.TurnContext)) *schemas.TurnContext {
		c := *root.Context
		mutate(&c)
		return &c
	}

	tests := []struct {
		name    string
		subject func(id string) string
		step    func() *schemas.AcceptedTurn
		code    schemas.Code
	}{
		{"a context with no seal", topology.StepSubject, func() *schemas.AcceptedTurn {
			return stepOf(t, root.TurnID, ctxWith(func(c *schemas.TurnContext) { c.Seal = nil }), 1)
		}, schemas.CodeTurnContextTampered},
		{"a context whose audience was widened", topology.StepSubject, func() *schemas.AcceptedTurn {
			return stepOf(t, root.TurnID, ctxWith(func(c *schemas.TurnContext) { c.Audience = schemas.AudiencePublic }), 2)
		}, schemas.CodeTurnContextTampered},
		{"a context sealed with a key ingest does not hold", topology.StepSubject, func() *schemas.AcceptedTurn {
			c := ctxWith(func(c *schemas.TurnContext) { c.Seal = nil })
			if err := foreign.Seal(c); err != nil {
				t.Fatal(err)
			}
			return stepOf(t, root.TurnID, c, 3)
		}, schemas.CodeSealKeyUnknown},
		{"the sealed context of another turn", topology.StepSubject, func() *schemas.AcceptedTurn {
			return stepOf(t, root.TurnID, other.Context, 4)
		}, schemas.CodeTurnContextMismatch},
		{"a turn id that is not a step batch's", topology.StepSubject, func() *schemas.AcceptedTurn {
			s := stepOf(t, root.TurnID, root.Context, 5)
			s.TurnID = root.TurnID
			return s
		}, schemas.CodeInvalidInput},
		{"a subject that is not the step batch's", func(string) string { return topology.StepSubject(root.TurnID + "-p99") }, func() *schemas.AcceptedTurn {
			return stepOf(t, root.TurnID, root.Context, 6)
		}, schemas.CodeInvalidInput},
		{"an origin that is not the step's turn", topology.StepSubject, func() *schemas.AcceptedTurn {
			s := stepOf(t, root.TurnID, root.Context, 7)
			s.Origin = other.TurnID
			return s
		}, schemas.CodeInvalidInput},
		{"follow-up fields", topology.StepSubject, func() *schemas.AcceptedTurn {
			s := stepOf(t, root.TurnID, root.Context, 8)
			s.FollowUpDepth = 1
			return s
		}, schemas.CodeInvalidInput},
		{"no calls", topology.StepSubject, func() *schemas.AcceptedTurn {
			s := stepOf(t, root.TurnID, root.Context, 9)
			s.Calls = nil
			return s
		}, schemas.CodeInvalidInput},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			s := tc.step()
			h.Publish(tc.subject(s.TurnID), topology.StepMsgID(s.TurnID), s)
			dls := h.WaitDLQ(pt.Ingest, i+1)
			if got, dl := dls[len(dls)-1].Header.Get(runner.HeaderCode), dls[len(dls)-1]; got != string(tc.code) {
				t.Fatalf("dead letter code %s (%s), want %s", got, dl.Header.Get(runner.HeaderReason), tc.code)
			}
		})
	}

	// The planner's own step batch runs, and is the only accepted turn:
	// every refused one was handled (dead-lettered) before it.
	good := stepOf(t, root.TurnID, root.Context, 0)
	h.Publish(topology.StepSubject(good.TurnID), topology.StepMsgID(good.TurnID), good)
	if b, _ := h.WaitTerminal(good.TurnID); b.State != schemas.BatchCompleted || b.Results[0].Output != "step" || b.Origin != root.TurnID {
		t.Fatalf("step batch %+v", b)
	}
	h.WaitIdle(pt.Executor)
	accepted := h.Messages(topology.StreamTurns, topology.SubjectTurnAccepted+">")
	if len(accepted) != 1 || accepted[0].Subject != topology.AcceptedSubject(schemas.SessionKeyOf(root.Context)) {
		t.Fatalf("accepted turns %v, want only the planner's step batch on its session", subjects(accepted))
	}
	if got, err := schemas.Decode[schemas.AcceptedTurn](accepted[0].Data); err != nil || got.TurnID != good.TurnID || got.Context.Seal == nil {
		t.Fatalf("forwarded %+v, %v", got, err)
	}
	if n := len(h.DLQ(pt.Ingest)); n != len(tests) {
		t.Fatalf("%d dead letters, want %d", n, len(tests))
	}
}

func subjects(ms []pt.Stored) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprint(m.Subject)
	}
	return out
}
