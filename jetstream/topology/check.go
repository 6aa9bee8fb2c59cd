package topology

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotProvisioned is wrapped by Check's error when a stream, bucket or
// consumer is missing or has a setting other than the topology's. The
// error names each one (see Change); `tollgate provision` fixes them.
var ErrNotProvisioned = errors.New("topology: not provisioned")

// Kinds of Change.
const (
	KindStream   = "stream"
	KindBucket   = "bucket"
	KindConsumer = "consumer"
)

// Change is one difference between what is on the server and what the
// topology wants: a stream, bucket or consumer that is missing (Missing:
// provisioning creates it), or that exists with the settings in Fields
// different (provisioning updates it).
type Change struct {
	Kind    string // KindStream, KindBucket or KindConsumer
	Name    string // stream or bucket name; "<stream>/<durable>" for a consumer
	Missing bool
	Fields  []FieldDiff
}

// FieldDiff is one setting that differs: its value on the server and the
// value the topology wants.
type FieldDiff struct {
	Field string `json:"field"`
	Have  string `json:"have"`
	Want  string `json:"want"`
}

// String is e.g. "stream TOLLGATE_EVENTS: missing" or
// "bucket tollgate_claims: max_age 1h0m0s, want 0s".
func (c Change) String() string {
	if c.Missing {
		return fmt.Sprintf("%s %s: missing", c.Kind, c.Name)
	}
	parts := make([]string, len(c.Fields))
	for i, f := range c.Fields {
		parts[i] = fmt.Sprintf("%s %s, want %s", f.Field, f.Have, f.Want)
	}
	return fmt.Sprintf("%s %s: %s", c.Kind, c.Name, strings.Join(parts, "; "))
}

// Plan compares the streams, buckets and turn-log streams of c and the
// given consumers with what is on the server and returns every
// difference, in that order (streams, buckets, turn-log streams,
// consumers); nothing is changed. An empty result means
// the topology is provisioned and compatible. It fails only when the
// server cannot be asked (a lookup fails other than with "not found").
//
// A consumer spec is compared as it is given: pass the configuration its
// stage creates (tollgate.StageConsumers), not the bare topology spec.
func Plan(ctx context.Context, js jetstream.JetStream, c Config, consumers []ConsumerSpec) ([]Change, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var changes []Change
	look := func(kind, name, stream string, diff func(have jetstream.StreamConfig) []FieldDiff) error {
		s, err := js.Stream(ctx, stream)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			changes = append(changes, Change{Kind: kind, Name: name, Missing: true})
		case err != nil:
			return fmt.Errorf("look up %s %s: %w", kind, name, err)
		default:
			if f := diff(s.CachedInfo().Config); len(f) > 0 {
				changes = append(changes, Change{Kind: kind, Name: name, Fields: f})
			}
		}
		return nil
	}
	for _, sc := range c.Streams() {
		if err := look(KindStream, sc.Name, sc.Name, func(have jetstream.StreamConfig) []FieldDiff { return streamDiff(have, sc) }); err != nil {
			return nil, err
		}
	}
	for _, sc := range c.BucketStreams() {
		name := strings.TrimPrefix(sc.Name, "KV_")
		if err := look(KindBucket, name, sc.Name, func(have jetstream.StreamConfig) []FieldDiff { return bucketDiff(have, sc) }); err != nil {
			return nil, err
		}
	}
	for _, sc := range c.TurnLogStreams() {
		if err := look(KindStream, sc.Name, sc.Name, func(have jetstream.StreamConfig) []FieldDiff { return turnLogDiff(have, sc) }); err != nil {
			return nil, err
		}
	}
	for _, cs := range consumers {
		name := cs.Stream + "/" + cs.Config.Durable
		cons, err := js.Consumer(ctx, cs.Stream, cs.Config.Durable)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			changes = append(changes, Change{Kind: KindConsumer, Name: name, Missing: true})
		case err != nil:
			return nil, fmt.Errorf("look up consumer %s: %w", name, err)
		default:
			if f := ConsumerDiff(cons.CachedInfo().Config, cs.Config); len(f) > 0 {
				changes = append(changes, Change{Kind: KindConsumer, Name: name, Fields: f})
			}
		}
	}
	return changes, nil
}

// Check is Plan for a process that must not change the topology (a stage
// started with --no-provision): nil when everything exists and is
// compatible, else an error wrapping ErrNotProvisioned that names every
// difference, or the error of a lookup that failed.
func Check(ctx context.Context, js jetstream.JetStream, c Config, consumers []ConsumerSpec) error {
	changes, err := Plan(ctx, js, c, consumers)
	if err != nil || len(changes) == 0 {
		return err
	}
	parts := make([]string, len(changes))
	for i, ch := range changes {
		parts[i] = ch.String()
	}
	return fmt.Errorf("%w (run `tollgate provision` as the admin user): %s", ErrNotProvisioned, strings.Join(parts, "; "))
}

// EnsureConsumer creates or updates the durable consumer of spec and
// returns it. A consumer whose configuration already matches (ConsumerDiff)
// is only read, as Ensure does for streams, so that a process whose user
// may not create consumers binds to one provisioned for it. It retries as
// Retry does.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, spec ConsumerSpec) (jetstream.Consumer, error) {
	var cons jetstream.Consumer
	err := Retry(ctx, func() (err error) {
		if c, err := js.Consumer(ctx, spec.Stream, spec.Config.Durable); err == nil && len(ConsumerDiff(c.CachedInfo().Config, spec.Config)) == 0 {
			cons = c
			return nil
		}
		cons, err = js.CreateOrUpdateConsumer(ctx, spec.Stream, spec.Config)
		return err
	})
	return cons, err
}

// diffs collects FieldDiffs.
type diffs []FieldDiff

func field[T comparable](d *diffs, name string, have, want T) {
	if have != want {
		*d = append(*d, FieldDiff{Field: name, Have: fmt.Sprint(have), Want: fmt.Sprint(want)})
	}
}

func list(d *diffs, name string, have, want []string) {
	field(d, name, strings.Join(have, ","), strings.Join(want, ","))
}

// streamDiff lists the settings Ensure controls on which an existing
// stream differs from want, including the limits it leaves unset (-1:
// none), so that a stream someone capped by hand (dropping queued turns
// under DiscardOld) is converged back.
func streamDiff(have, want jetstream.StreamConfig) []FieldDiff {
	var d diffs
	list(&d, "subjects", have.Subjects, want.Subjects)
	field(&d, "description", have.Description, want.Description)
	field(&d, "retention", have.Retention, want.Retention)
	field(&d, "max_age", have.MaxAge, want.MaxAge)
	field(&d, "storage", have.Storage, want.Storage)
	field(&d, "replicas", have.Replicas, want.Replicas)
	field(&d, "duplicate_window", have.Duplicates, want.Duplicates)
	field(&d, "max_msg_size", have.MaxMsgSize, want.MaxMsgSize)
	field(&d, "discard", have.Discard, want.Discard)
	field(&d, "allow_msg_schedules", have.AllowMsgSchedules, want.AllowMsgSchedules)
	field(&d, "allow_rollup_hdrs", have.AllowRollup, want.AllowRollup)
	field(&d, "allow_direct", have.AllowDirect, want.AllowDirect)
	// allow_atomic is not compared: an earlier version turned it on for
	// its group committer, since removed, and a stream that still allows
	// atomic batch publish is harmless (nothing sends one), so it is
	// neither drift nor a reason to rewrite the stream.
	field(&d, "max_msgs", have.MaxMsgs, -1)
	field(&d, "max_bytes", have.MaxBytes, -1)
	field(&d, "max_msgs_per_subject", have.MaxMsgsPerSubject, -1)
	field(&d, "deny_delete", have.DenyDelete, false)
	field(&d, "deny_purge", have.DenyPurge, false)
	field(&d, "sealed", have.Sealed, false)
	return d
}

// bucketDiff lists the settings Ensure controls on which a bucket's backing
// stream differs from want. In particular no bucket-wide TTL (MaxAge) and no
// size caps: a live claim or approval that expired would let a call run
// twice or vanish. Records leave only by the per-message TTL of their last
// write (allow_msg_ttl), once they have ended.
// AllowDirect is part of it: a replicated bucket that allows direct gets
// can serve stale reads (see DirectGets).
func bucketDiff(have, want jetstream.StreamConfig) []FieldDiff {
	var d diffs
	list(&d, "subjects", have.Subjects, want.Subjects)
	field(&d, "description", have.Description, want.Description)
	field(&d, "history", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	field(&d, "storage", have.Storage, want.Storage)
	field(&d, "replicas", have.Replicas, want.Replicas)
	field(&d, "max_value_size", have.MaxMsgSize, want.MaxMsgSize)
	field(&d, "allow_direct", have.AllowDirect, want.AllowDirect)
	field(&d, "allow_rollup_hdrs", have.AllowRollup, true)
	field(&d, "deny_delete", have.DenyDelete, true)
	field(&d, "max_age", have.MaxAge, 0)
	field(&d, "allow_msg_ttl", have.AllowMsgTTL, want.AllowMsgTTL)
	// Nor allow_atomic, as in streamDiff.
	field(&d, "discard", have.Discard, jetstream.DiscardNew)
	field(&d, "max_msgs", have.MaxMsgs, -1)
	field(&d, "max_bytes", have.MaxBytes, -1)
	field(&d, "sealed", have.Sealed, false)
	return d
}

// ConsumerDiff lists the settings a stage's runner decides on which an
// existing consumer differs from want: the filter subjects and how it is
// acknowledged and redelivered.
func ConsumerDiff(have, want jetstream.ConsumerConfig) []FieldDiff {
	var d diffs
	field(&d, "filter_subject", have.FilterSubject, want.FilterSubject)
	list(&d, "filter_subjects", have.FilterSubjects, want.FilterSubjects)
	field(&d, "deliver_policy", have.DeliverPolicy, want.DeliverPolicy)
	field(&d, "ack_policy", have.AckPolicy, want.AckPolicy)
	field(&d, "ack_wait", have.AckWait, want.AckWait)
	field(&d, "max_deliver", have.MaxDeliver, want.MaxDeliver)
	field(&d, "max_ack_pending", have.MaxAckPending, want.MaxAckPending)
	return d
}
