package planner_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestEndedLoopsLeaveThePlannersBucketAfterTheRetention: with a 2 s
// retention, an ended loop's turn and step records and its session's idle
// conversation leave the planner's bucket, while a loop still waiting for a
// person (older than the retention by then) keeps its records.
func TestEndedLoopsLeaveThePlannersBucketAfterTheRetention(t *testing.T) {
	model := plannertest.New(t)
	opts := options(model, planner.Budget{})
	h := pipelinetest.Start(t, pipelinetest.Options{
		Policy: testPolicy, Planner: &opts, Retention: 2 * time.Second,
		Stages: append(slices.Clone(pipelinetest.AllStages), tollgate.StagePlanner),
	})
	f := &fixture{H: h, model: model, opts: opts}
	waiting, done := "save it and wait", "just answer"
	model.Script(waiting,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"kept.txt","content":"x"}`}}},
		plannertest.Reply{Text: "saved"})
	model.Script(done, plannertest.Reply{Text: "answered"})
	live := f.say("kept", waiting)
	f.WaitPending(schemas.ApprovalID(schemas.PlannerStepTurnID(live, 0), 0))
	ended := f.say("gone", done)
	if r := f.waitReply(ended); r.Text != "answered" {
		t.Fatalf("reply %q", r.Text)
	}

	ctx, cancel := f.Ctx()
	defer cancel()
	kv, err := f.JS.KeyValue(ctx, topology.BucketPlanner)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(key string) bool {
		t.Helper()
		ctx, cancel := f.Ctx()
		defer cancel()
		_, err := kv.Get(ctx, key)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	gone := []string{ended, schemas.PlannerStepKey(ended, 0), schemas.ConversationKey(schemas.SessionKey("cli", "gone"))}
	for _, k := range gone {
		if !exists(k) {
			t.Fatalf("%s is gone at once; it must stay until the retention has passed", k)
		}
	}
	jstest.Eventually(t, 30*time.Second, "the ended loop's records gone", func() bool {
		return !slices.ContainsFunc(gone, exists)
	})
	for _, k := range []string{live, schemas.PlannerStepKey(live, 0)} {
		if !exists(k) {
			t.Fatalf("%s of the loop still waiting for a person is gone", k)
		}
	}
}
