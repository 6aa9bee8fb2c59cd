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

	// BucketPlanner holds planner turns, their steps, the sessions'
	// conversations and loop queues.
	BucketPlanner = "tollgate_planner"

	// ConsumerPlanner reads planner turns and loop-ready notices;
	// ConsumerPlannerOutcomes reads turn outcomes (the planner acts on those
	// of its step batches).
	ConsumerPlanner         = "planner"
	ConsumerPlannerOutcomes = "planner-outcomes"
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

// ReplyMsgID is the message id of the reply event of turnID.
func ReplyMsgID(turnID string) string { return "reply:" + turnID }

// PlannerConsumers returns the planner's two durable consumers.
func PlannerConsumers() []ConsumerSpec {
	return []ConsumerSpec{
		{Stream: StreamTurns, Config: jetstream.ConsumerConfig{
			Durable:        ConsumerPlanner,
			FilterSubjects: []string{SubjectTurnPlan + "*", SubjectPlanReady + "*"},
		}},
		{Stream: StreamEvents, Config: jetstream.ConsumerConfig{
			Durable:       ConsumerPlannerOutcomes,
			FilterSubject: SubjectTurnOutcome + "*",
		}},
	}
}

// PlannerBucket returns the configuration of the planner's bucket, as
// Buckets does for the others.
func (c Config) PlannerBucket() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       BucketPlanner,
		Description:  "Tollgate: planner turns, model steps, conversations and loop queues",
		History:      5,
		Storage:      c.Storage,
		Replicas:     c.Replicas,
		MaxValueSize: 1 << 20,
	}
}

// EnsurePlannerBucket creates or updates the planner's bucket and returns
// it. Like the other buckets (see DirectGets), a replicated planner bucket
// does not allow direct gets: nats.go creates every bucket with them on, so
// they are turned off before the bucket is bound. A bucket whose settings
// already match is only read, as Ensure does, so that a planner whose user
// may not create or update streams binds to the bucket admin provisioned
// (`tollgate provision --planner`).
func EnsurePlannerBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	if s, err := js.Stream(ctx, "KV_"+BucketPlanner); err == nil && plannerBucketMatches(s.CachedInfo().Config, c) {
		return js.KeyValue(ctx, BucketPlanner)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, c.PlannerBucket()); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketPlanner, err)
	}
	if !c.DirectGets() {
		s, err := js.Stream(ctx, "KV_"+BucketPlanner)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", BucketPlanner, err)
		}
		if sc := s.CachedInfo().Config; sc.AllowDirect {
			sc.AllowDirect = false
			if _, err := js.UpdateStream(ctx, sc); err != nil {
				return nil, fmt.Errorf("bucket %s: %w", BucketPlanner, err)
			}
		}
	}
	return js.KeyValue(ctx, BucketPlanner)
}

// plannerBucketMatches reports whether have, the planner bucket's stream,
// has the settings EnsurePlannerBucket would give it.
func plannerBucketMatches(have jetstream.StreamConfig, c Config) bool {
	want := c.PlannerBucket()
	return have.Description == want.Description && have.MaxMsgsPerSubject == int64(want.History) &&
		have.Storage == want.Storage && have.Replicas == want.Replicas &&
		have.MaxMsgSize == want.MaxValueSize && (c.DirectGets() || !have.AllowDirect)
}
