package planner_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A step batch that the previous version stored as a message schedule
// (tollgate.turn.schedule.<turn>-p<n>, due at once, its target the
// session's accepted subject) still runs after an upgrade, and the loop
// goes on from its outcome. Ingest's copy of the same step batch, forwarded
// later, makes no second batch, outcome or reply.
func TestAStepBatchScheduledByThePreviousVersionStillRuns(t *testing.T) {
	f := start(t, planner.Budget{}, true)
	ctx, cancel := f.Ctx()
	defer cancel()
	// Ingest does not forward step batches until the test says so: the
	// schedule below is the step batch's only way to the executor.
	jstest.Eventually(t, pipelinetest.Wait, "ingest's step consumer", func() bool {
		_, err := f.JS.Consumer(ctx, topology.StreamTurns, topology.ConsumerIngestSteps)
		return err == nil
	})
	if _, err := f.JS.PauseConsumer(ctx, topology.StreamTurns, topology.ConsumerIngestSteps, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	text := "echo across the upgrade"
	f.model.Script(text,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "echo", Args: `{"text":"old"}`}}},
		plannertest.Reply{Text: "echoed"})
	stop := f.runPlanner()
	defer stop()
	turn := f.say("upgrade", text)
	step := schemas.PlannerStepTurnID(turn, 0)
	var stored []pipelinetest.Stored
	jstest.Eventually(t, pipelinetest.Wait, "the step batch published for ingest", func() bool {
		stored = f.Messages(topology.StreamTurns, topology.StepSubject(step))
		return len(stored) == 1
	})

	// The previous version's message schedule of the same step batch.
	accepted := topology.AcceptedSubject(schemas.SessionKey("cli", "upgrade"))
	hdr := nats.Header{}
	hdr.Set("Nats-Schedule", "@at "+time.Now().UTC().Truncate(time.Second).Format(time.RFC3339))
	hdr.Set("Nats-Schedule-Target", accepted)
	f.PublishRaw(topology.SubjectTurnSchedule+step, topology.ScheduleMsgID(step), stored[0].Data, hdr)

	if r := f.waitReply(turn); r.Text != "echoed" || r.Steps != 2 {
		t.Fatalf("reply %+v", r)
	}
	if n := len(f.Messages(topology.StreamTurns, accepted)); n != 1 {
		t.Fatalf("%d accepted turns on the session, want the schedule's one", n)
	}

	// Ingest resumes and forwards its copy: still one batch, one outcome,
	// one reply.
	if _, err := f.JS.ResumeConsumer(ctx, topology.StreamTurns, topology.ConsumerIngestSteps); err != nil {
		t.Fatal(err)
	}
	jstest.Eventually(t, pipelinetest.Wait, "ingest forwarded its copy", func() bool {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ok, _ := jstest.CaughtUp(c, f.JS, topology.StreamTurns, topology.ConsumerIngestSteps)
		return ok && len(f.Messages(topology.StreamTurns, accepted)) == 2
	})
	f.WaitIdle(pipelinetest.Executor)
	if n := len(f.Outcomes(step)); n != 1 {
		t.Fatalf("step batch has %d outcomes, want 1", n)
	}
	if n := len(f.replies(turn)); n != 1 {
		t.Fatalf("%d replies, want 1", n)
	}
	if n := len(f.model.Requests(text)); n != 2 {
		t.Fatalf("%d model requests, want 2", n)
	}
}
