package topology

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// The planner stage's part of the topology (pipeline/planner). It runs only
// where a model endpoint is configured, so its bucket is ensured by the
// planner itself (EnsurePlannerBucket) and its consumers by its runners, not
// by Ensure.
const (
	// SubjectTurnPlan is where ingest publishes an accepted turn with text
	// and no calls, when the planner is on (in TOLLGATE_TURNS).
	SubjectTurnPlan = "tollgate.turn.plan." // + session key
	// SubjectPlanReady announces a planner turn whose session's loop queue
	// let it run (in TOLLGATE_TURNS).
	SubjectPlanReady = "tollgate.turn.planready." // + session key
	// SubjectTurnReply carries the planner's final answer, a ReplyEvent.
	SubjectTurnReply = "tollgate.event.turn.reply." // + turn id
	// SubjectTurnStep is where the planner publishes a step's batch of
	// tool calls (in TOLLGATE_TURNS). Ingest, and only ingest, takes it
	// from there to the session's accepted subject (ingest.HandleStep):
	// no other stage publishes accepted turns.
	SubjectTurnStep = "tollgate.turn.step." // + step batch turn id (schemas.PlannerStepTurnID)

	// BucketPlanner holds planner turns, their steps, the sessions'
	// conversations and loop queues.
	BucketPlanner = "tollgate_planner"

	// ConsumerPlanner reads planner turns and loop-ready notices;
	// ConsumerPlannerOutcomes reads turn outcomes (the planner acts on those
	// of its step batches).
	ConsumerPlanner         = "planner"
	ConsumerPlannerOutcomes = "planner-outcomes"
	// ConsumerIngestSteps is ingest's durable on the step batches
	// (`ingest --plan`).
	ConsumerIngestSteps = "ingest-steps"
)

// PlanSubject is where ingest publishes a text-only turn of the session
// with key sessionKey.
func PlanSubject(sessionKey string) string { return SubjectTurnPlan + sessionKey }

// PlanReadySubject is where a planner turn is announced once its session's
// previous loop ended.
func PlanReadySubject(sessionKey string) string { return SubjectPlanReady + sessionKey }

// PlanMsgID is the message id of the planner turn turnID.
func PlanMsgID(turnID string) string { return "plan:" + turnID }

// PlanReadyMsgID is the message id of the loop-ready notice of turnID.
func PlanReadyMsgID(turnID string) string { return "planready:" + turnID }

// PlanReadyAfterMsgID is PlanReadyMsgID for the notice the end of turn
// after, the turn before turnID in its session's order, sends it (see
// ReadyAfterMsgID).
func PlanReadyAfterMsgID(turnID, after string) string {
	return "planready:" + turnID + ":after:" + after
}

// StepSubject is where the planner publishes the step batch with turn id
// batchID.
func StepSubject(batchID string) string { return SubjectTurnStep + batchID }

// StepMsgID is the message id of the step batch batchID on
// SubjectTurnStep: "step:<batch>".
func StepMsgID(batchID string) string { return "step:" + batchID }

// ReplyMsgID is the message id of the reply event of turnID.
func ReplyMsgID(turnID string) string { return "reply:" + turnID }

// PlannerConsumers returns the planner's two durable consumers. The first
// reads the planner's entries of the sessions' orders (OrderFilter(OrderPlan):
// the planner turns ingest accepts), the plan subject (planner turns an
// earlier version accepted there) and loop-ready notices.
func PlannerConsumers() []ConsumerSpec {
	return []ConsumerSpec{
		{Stream: StreamTurns, Config: jetstream.ConsumerConfig{
			Durable:        ConsumerPlanner,
			FilterSubjects: []string{OrderFilter(OrderPlan), SubjectTurnPlan + "*", SubjectPlanReady + "*"},
		}},
		{Stream: StreamEvents, Config: jetstream.ConsumerConfig{
			Durable:       ConsumerPlannerOutcomes,
			FilterSubject: SubjectTurnOutcome + "*",
		}},
	}
}

// IngestStepsConsumer is ingest's durable on the planner's step batches
// (SubjectTurnStep). It exists where a planner runs: ingest consumes it
// with Plan set, and `tollgate provision --planner` creates it.
func IngestStepsConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamTurns, Config: jetstream.ConsumerConfig{
		Durable:       ConsumerIngestSteps,
		FilterSubject: SubjectTurnStep + "*",
	}}
}

// PlannerBucket returns the configuration of the planner's bucket, as
// Buckets does for the others: one revision per key, like them, so that an
// ended record written with a TTL replaces the key's only earlier revision
// and the key is gone once the TTL runs out (pipeline/store, "Retention").
func (c Config) PlannerBucket() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       BucketPlanner,
		Description:  "Tollgate: planner turns, model steps, conversations and loop queues",
		History:      1,
		Storage:      c.Storage,
		Replicas:     c.Replicas,
		MaxValueSize: 1 << 20,
	}
}

// PlannerBucketStream is the stream that backs the planner's bucket, made
// as BucketStreams makes the others' (per-message TTLs allowed, direct gets
// only where DirectGets allows them).
func (c Config) PlannerBucketStream() jetstream.StreamConfig {
	return c.bucketStream(c.PlannerBucket())
}

// EnsurePlannerBucket creates or updates the planner's bucket and returns
// it. A bucket whose stream already matches PlannerBucketStream is only
// read, as Ensure does, so that a planner whose user may not create or
// update streams binds to the bucket admin provisioned (`tollgate provision
// --planner`). A bucket made by an earlier version (five revisions per key,
// no per-message TTLs) is updated in place: its history shrinks to one and
// TTLs are allowed.
func EnsurePlannerBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	sc := c.PlannerBucketStream()
	if s, err := js.Stream(ctx, sc.Name); err == nil && len(bucketDiff(s.CachedInfo().Config, sc)) == 0 {
		return js.KeyValue(ctx, BucketPlanner)
	}
	if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketPlanner, err)
	}
	return js.KeyValue(ctx, BucketPlanner)
}

// CheckPlannerBucket binds to the planner's bucket as admin provisioned it,
// and fails, naming what differs, if its stream is not PlannerBucketStream
// (for a planner that must not create or change streams).
func CheckPlannerBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	sc := c.PlannerBucketStream()
	s, err := js.Stream(ctx, sc.Name)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketPlanner, err)
	}
	if d := bucketDiff(s.CachedInfo().Config, sc); len(d) > 0 {
		return nil, fmt.Errorf("bucket %s differs from what this version needs (%+v): run tollgate provision --planner", BucketPlanner, d)
	}
	return js.KeyValue(ctx, BucketPlanner)
}
