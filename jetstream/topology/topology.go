// Package topology names Tollgate's JetStream streams, subjects, consumers
// and KV buckets, and creates or updates them idempotently.
//
// `tollgate provision` (an admin user) calls Ensure and EnsureConsumer for
// every stage; a stage calls Ensure at start too unless it runs with
// --no-provision, when it only calls Check (see check.go). So the first
// process to run creates the topology and later ones converge it to the
// same configuration, or refuse to start when it is missing or differs. The table in
// docs/protocol.md is the public description of what this package creates;
// keep the two in step.
package topology

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Streams.
const (
	StreamInbound   = "TOLLGATE_INBOUND"
	StreamTurns     = "TOLLGATE_TURNS"
	StreamDecisions = "TOLLGATE_DECISIONS"
	StreamEvents    = "TOLLGATE_EVENTS"
	StreamDLQ       = "TOLLGATE_DLQ"
)

// Subjects. Ids in the last token let consumers keep per-session (turns),
// per-approval (decisions) and per-turn (events) order while spreading
// different keys across goroutines, and let a watcher filter one turn.
const (
	SubjectInboundPrefix     = "tollgate.inbound."                  // + transport + "." + session key
	SubjectTurnAccepted      = "tollgate.turn.accepted."            // + session key
	SubjectTurnReady         = "tollgate.turn.ready."               // + session key
	SubjectTurnSchedule      = "tollgate.turn.schedule."            // + follow-up turn id: delayed follow-ups (message schedules)
	SubjectDecisionSubmit    = "tollgate.decision.submit."          // + transport + "." + approval id
	SubjectApprovalRequested = "tollgate.event.approval.requested." // + turn id
	SubjectApprovalDecided   = "tollgate.event.approval.decided."   // + turn id
	SubjectApprovalVoted     = "tollgate.event.approval.voted."     // + turn id: a quorum vote counted, more needed
	SubjectDecisionRejected  = "tollgate.event.decision.rejected."  // + approval id (or "invalid")
	SubjectBatchAwaiting     = "tollgate.event.batch.awaiting."     // + turn id
	SubjectRedrive           = "tollgate.event.redrive."            // + kind + "." + turn id
	SubjectTurnOutcome       = "tollgate.event.turn.outcome."       // + turn id
	SubjectGrantEvent        = "tollgate.event.grant."              // + kind + "." + grant id (GrantEventSubject)
	SubjectDLQPrefix         = "tollgate.dlq."                      // + stage
)

// SubjectToolsList is a core NATS request subject, in no stream: the
// executor answers it with every tool it can call and the policy mode of
// each per audience (schemas.ToolList; `tollgate tools`).
const SubjectToolsList = "tollgate.tools.list"

// InboundSubject is where a transport publishes a message of session
// sessionID: tollgate.inbound.<transport>.<session key>. The transport token
// is the publisher's identity (ingest binds the body's transport to it); the
// session token lets the executor find a session's earlier messages in
// arrival order (InboundSessionSubject), so that scaled ingest and executor
// replicas still run a session's turns in the order they arrived.
func InboundSubject(transport, sessionID string) string {
	return SubjectInboundPrefix + transport + "." + schemas.SessionKey(transport, sessionID)
}

// LegacyInboundSubject is the subject a transport of the previous version
// published a message of session sessionID on (its session token was
// schemas.LegacySessionKey). Ingest still admits a message stored there, so
// that nothing published before an upgrade, or by a transport not yet
// upgraded, is lost; the turn it becomes belongs to the transport-scoped
// session all the same (the key is computed from the body's transport,
// which must be the subject's).
func LegacyInboundSubject(transport, sessionID string) string {
	return SubjectInboundPrefix + transport + "." + schemas.LegacySessionKey(sessionID)
}

// InboundSessionFilter matches the inbound messages stored under session
// key sessionKey, from any transport. The order check uses it only for a
// turn sealed before sessions were scoped by transport, whose legacy key
// several transports shared (InboundSessionSubject otherwise).
func InboundSessionFilter(sessionKey string) string { return SubjectInboundPrefix + "*." + sessionKey }

// InboundSessionSubject is the one subject on which transport's messages of
// the session with transport-scoped key sessionKey (schemas.SessionKey) are
// stored: the session-order check's filter. A message another transport
// stored under the same key cannot be one of the session's turns (ingest's
// Admit refuses a key that is not SessionKey of the message's own
// transport), so it never holds the session's turns back and need not be
// looked at. A literal filter also lets the server find a session's next
// message from its per-subject index: with the transport token a wildcard,
// nats-server 2.15 matched every message it scanned, and the first turn of
// a session (no watermark yet) scanned the stream from its start, which
// under a steady stream of new sessions took 39 % of a process's CPU
// (docs/bench.md, "Where Tollgate's own time goes").
func InboundSessionSubject(transport, sessionKey string) string {
	return SubjectInboundPrefix + transport + "." + sessionKey
}

// AcceptedSubject is where ingest publishes a turn of the session with key sessionKey.
func AcceptedSubject(sessionKey string) string { return SubjectTurnAccepted + sessionKey }

// ReadySubject is where a queued turn is announced once its session is free.
func ReadySubject(sessionKey string) string { return SubjectTurnReady + sessionKey }

// DecisionSubject is where a transport submits a decision on approvalID.
// The transport token is the publisher's identity: NATS permissions can let
// each transport publish only under its own token, and the approver rejects
// a decision whose body names another transport.
func DecisionSubject(transport, approvalID string) string {
	return SubjectDecisionSubmit + transport + "." + approvalID
}

// SubjectDecide is the core NATS request subject, in no stream, on which
// the approver answers a decision at once:
// tollgate.decide.<transport>.<approval id> (DecideSubject). A decision
// applied there is made durable once, by the approver's compare-and-set
// on the approval record; TOLLGATE_DECISIONS does not keep it.
const SubjectDecide = "tollgate.decide."

// DecideSubject is where a transport sends a decision on approvalID as a
// request (SubjectDecide). Its transport token is the sender's identity,
// as DecisionSubject's is.
func DecideSubject(transport, approvalID string) string {
	return SubjectDecide + transport + "." + approvalID
}

// DLQSubject is where stage dead-letters a message.
func DLQSubject(stage string) string { return SubjectDLQPrefix + stage }

// GrantEventSubject is where a grant event of kind on grant id is
// published: tollgate.event.grant.<kind>.<grant id>.
func GrantEventSubject(kind schemas.GrantEventKind, grantID string) string {
	return SubjectGrantEvent + string(kind) + "." + grantID
}

// GrantEventMsgID deduplicates a grant event: one created and one revoked
// event per grant, one used event per approval the grant decided.
func GrantEventMsgID(kind schemas.GrantEventKind, grantID, approvalID string) string {
	if kind == schemas.GrantUsed {
		return "grant-used:" + approvalID
	}
	return "grant-" + string(kind) + ":" + grantID
}

// EventSubject joins an event prefix and an id token.
func EventSubject(prefix, id string) string { return prefix + id }

// KV buckets.
const (
	BucketApprovals = "tollgate_approvals"
	BucketBatches   = "tollgate_batches"
	BucketSessions  = "tollgate_sessions"
	BucketClaims    = "tollgate_claims"
	// BucketGrants holds standing grants by grant id and their indexes by
	// (tool, requester) (schemas.Grant, schemas.GrantIndex).
	BucketGrants = "tollgate_grants"
	// BucketWebSessions holds the web inbox's sign-in sessions, by the
	// SHA-256 of their id (transport/web), each written with a TTL.
	BucketWebSessions = "tollgate_web_sessions"
)

// The approvals bucket's own stream, and the subject of each approval's
// revisions in it: every write of an approval record (its creation, each
// vote, its decision) is a message there, and a revision that holds a
// decided record is the approval's decision (docs/protocol.md §4.2b; the
// projection is pipeline/store's DecidedOf). The bucket keeps one
// revision per key.
const (
	StreamApprovals        = "KV_" + BucketApprovals
	ApprovalRevisionPrefix = "$KV." + BucketApprovals + "."
	// ApprovalRevisions is the filter of every approval's revisions.
	ApprovalRevisions = ApprovalRevisionPrefix + ">"
)

// ApprovalRevisionSubject is the subject of approval id's revisions in
// StreamApprovals: a core subscription to it hears each write of the
// record as it is stored.
func ApprovalRevisionSubject(id string) string { return ApprovalRevisionPrefix + id }

// Durable consumer names, one per stage.
const (
	ConsumerIngest   = "ingest"
	ConsumerExecutor = "executor"
	ConsumerApprover = "approver"
	ConsumerRedriver = "redriver"
)

// Config sets what may differ between deployments.
type Config struct {
	// Replicas for every stream and bucket: 1 on a single server, 3 on a
	// three-node cluster.
	Replicas int
	// MaxAge bounds how long stream history is kept for replay.
	MaxAge time.Duration
	// Storage is jetstream.FileStorage except in throwaway setups.
	Storage jetstream.StorageType
	// DuplicateWindow is the Nats-Msg-Id dedupe window on every stream.
	DuplicateWindow time.Duration
	// TurnLogPartitions is how many turn-log streams a turn's events are
	// spread over (TurnLogStreams); 0 is DefaultTurnLogPartitions.
	TurnLogPartitions int
}

// DefaultConfig is a single server keeping 30 days of history.
func DefaultConfig() Config {
	return Config{Replicas: 1, MaxAge: 30 * 24 * time.Hour, Storage: jetstream.FileStorage, DuplicateWindow: 2 * time.Minute}
}

// Validate reports a configuration that Ensure would reject.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("topology: replicas %d: want 1 to 5", c.Replicas)
	case c.MaxAge <= 0:
		return errors.New("topology: max age must be positive")
	case c.DuplicateWindow <= 0 || c.DuplicateWindow > c.MaxAge:
		return errors.New("topology: duplicate window must be positive and at most max age")
	case c.TurnLogPartitions < 0 || c.TurnLogPartitions > MaxTurnLogPartitions:
		return fmt.Errorf("topology: turn-log partitions %d: want 1 to %d (0: %d)", c.TurnLogPartitions, MaxTurnLogPartitions, DefaultTurnLogPartitions)
	}
	return nil
}

// streamBase is every Tollgate stream's configuration: its limits,
// history, replicas and duplicate window.
func (c Config) streamBase(name, desc string, subjects ...string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: desc,
		Subjects:    subjects,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      c.MaxAge,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
		Duplicates:  c.DuplicateWindow,
		MaxMsgSize:  1 << 20,
		Discard:     jetstream.DiscardOld,
	}
}

// Streams returns the stream configurations Ensure creates.
func (c Config) Streams() []jetstream.StreamConfig {
	mk := c.streamBase
	turns := mk(StreamTurns, "Tollgate: accepted turns, session-ready notices and scheduled follow-ups", "tollgate.turn.>")
	// Delayed follow-up work is a message schedule (nats-server 2.12+):
	// the server publishes it on the accepted subject when it is due.
	// Schedules need roll-ups allowed and purges not denied.
	turns.AllowMsgSchedules, turns.AllowRollup = true, true
	inbound := mk(StreamInbound, "Tollgate: inbound chat-transport messages", SubjectInboundPrefix+">")
	// The two streams read by message get on every turn (a session's
	// order and its earlier inbound messages: jetstream/turnorder,
	// pipeline/sessionorder) allow direct gets where the buckets do
	// (DirectGets: one replica, so no follower answers stale). A direct
	// get skips the JetStream API's routed JSON request and base64
	// reply on both sides (docs/bench.md, "A session's first turn, and
	// direct gets on the turn streams").
	turns.AllowDirect, inbound.AllowDirect = c.DirectGets(), c.DirectGets()
	return []jetstream.StreamConfig{
		inbound,
		turns,
		mk(StreamDecisions, "Tollgate: human decisions on approvals", "tollgate.decision.>"),
		mk(StreamEvents, "Tollgate: approval, redrive and outcome events", "tollgate.event.>"),
		mk(StreamDLQ, "Tollgate: dead letters with original bytes and reason codes", SubjectDLQPrefix+">"),
	}
}

// DirectGets reports whether the buckets allow direct gets (AllowDirect):
// only with a single replica.
//
// A direct get is answered by any replica of the bucket's stream, and a
// follower may not have applied a write that the leader has already
// acknowledged. The stages read their own and each other's writes at once
// (a session acquired then released by one worker, a release announced on
// the ready subject and acted on by another, the last of a batch's
// decisions checked against its siblings), and some of those reads decide
// that there is nothing to do: a stale one would drop the work, not just
// cost a compare-and-set retry (docs/operations.md, "Running a three-node
// cluster"). With several replicas the buckets therefore turn direct gets
// off, and nats.go reads a key with a message get, which the stream leader
// answers. With one replica there is no follower to be stale, and direct
// gets (nats.go's default for KV) stay on.
func (c Config) DirectGets() bool { return c.Replicas == 1 }

// Buckets returns the KV bucket configurations Ensure creates. Each keeps
// one revision per key (history 1): a record's past is in the streams, and
// an older revision left behind could reappear as the record when an ended
// one's TTL runs out. Removing such revisions explicitly (a rollup, a
// purge) costs more than it seems: nats-server makes every consumer of
// the bucket's stream recount its pending messages after any removal of
// more than one message at once (stream.storeUpdates), which under load
// took a third of the server's CPU; a write that replaces the one revision
// is a single removal, which it accounts for cheaply.
func (c Config) Buckets() []jetstream.KeyValueConfig {
	mk := func(name, desc string, history uint8) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{
			Bucket:       name,
			Description:  desc,
			History:      history,
			Storage:      c.Storage,
			Replicas:     c.Replicas,
			MaxValueSize: 1 << 20,
		}
	}
	return []jetstream.KeyValueConfig{
		mk(BucketApprovals, "Tollgate: approval records by approval id", 1),
		mk(BucketBatches, "Tollgate: batch records by turn id", 1),
		mk(BucketSessions, "Tollgate: per-session batch queue", 1),
		mk(BucketClaims, "Tollgate: tool execution claims by call id", 1),
		mk(BucketGrants, "Tollgate: standing grants by grant id, and their index by tool and requester", 1),
		mk(BucketWebSessions, "Tollgate: web inbox sessions by hashed id, each with a TTL", 1),
	}
}

// BucketStreams returns the configurations of the streams that back the
// buckets: what nats.go's CreateKeyValue makes of Buckets(), except that
// AllowDirect follows DirectGets, and that per-message TTLs are allowed
// (AllowMsgTTL, nats-server 2.11+): an ended record is written with a TTL
// and leaves the bucket when it runs out (pipeline/store, Store.Retain).
// The buckets themselves have no MaxAge and no size limits: a record that
// has not ended never expires. No subject delete markers either: nothing
// watches for a retired record's removal. (A server lets AllowMsgTTL be
// turned on for an existing stream, never off.) Ensure writes these (and not the
// KeyValueConfig, from which nats.go always makes AllowDirect true), so a
// replicated bucket never allows direct gets, not even for a moment.
func (c Config) BucketStreams() []jetstream.StreamConfig {
	var out []jetstream.StreamConfig
	for _, kc := range c.Buckets() {
		out = append(out, c.bucketStream(kc))
	}
	return out
}

// bucketStream is the stream that backs bucket kc (see BucketStreams).
func (c Config) bucketStream(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              "KV_" + kc.Bucket,
		Description:       kc.Description,
		Subjects:          []string{"$KV." + kc.Bucket + ".>"},
		MaxMsgsPerSubject: int64(kc.History),
		MaxBytes:          -1,
		MaxMsgSize:        kc.MaxValueSize,
		Storage:           kc.Storage,
		Replicas:          kc.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       c.DirectGets(),
		Discard:           jetstream.DiscardNew,
		AllowMsgTTL:       true,
	}
}

// Ensure creates or updates every stream and bucket. It is idempotent and
// safe to call concurrently from several processes. A stream or bucket
// whose configuration already matches is left alone (only read), so that
// many workers starting together do not rewrite every stream's config
// while their peers create consumers on it. A pass that fails in a way
// another pass may not (see Retry: on a cluster, concurrent creations of one
// stream can go unanswered) is run again.
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return Retry(ctx, func() error { return ensure(ctx, js, c) })
}

func ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	// Refused before anything is written: an Ensure that cannot converge
	// the turn logs must not leave the rest converged to a configuration
	// the deployment has not run yet.
	if err := c.checkPartitions(ctx, js); err != nil {
		return err
	}
	for _, sc := range c.Streams() {
		if s, err := js.Stream(ctx, sc.Name); err == nil && len(streamDiff(s.CachedInfo().Config, sc)) == 0 {
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
	}
	for _, sc := range c.BucketStreams() {
		if s, err := js.Stream(ctx, sc.Name); err == nil && len(bucketDiff(s.CachedInfo().Config, sc)) == 0 {
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure bucket %s: %w", strings.TrimPrefix(sc.Name, "KV_"), err)
		}
	}
	for _, sc := range c.TurnLogStreams() {
		if s, err := js.Stream(ctx, sc.Name); err == nil && len(turnLogDiff(s.CachedInfo().Config, sc)) == 0 {
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// Buckets is the set of KV handles every stage uses, with the turn-log
// streams and the JetStream they were opened on.
type Buckets struct {
	Approvals jetstream.KeyValue
	Batches   jetstream.KeyValue
	Sessions  jetstream.KeyValue
	Claims    jetstream.KeyValue
	Grants    jetstream.KeyValue
	// TurnLogs are the turn-log streams, by partition (OpenTurnLogs).
	TurnLogs []jetstream.Stream
	// JS is the JetStream everything above was opened on.
	JS jetstream.JetStream
}

// OpenBuckets binds to the existing buckets and turn-log streams. It fails
// with jetstream.ErrBucketNotFound or jetstream.ErrStreamNotFound if
// Ensure has not run.
func OpenBuckets(ctx context.Context, js jetstream.JetStream) (Buckets, error) {
	b := Buckets{JS: js}
	for _, p := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{BucketApprovals, &b.Approvals}, {BucketBatches, &b.Batches}, {BucketSessions, &b.Sessions}, {BucketClaims, &b.Claims}, {BucketGrants, &b.Grants}} {
		kv, err := js.KeyValue(ctx, p.name)
		if err != nil {
			return Buckets{}, fmt.Errorf("open bucket %s: %w", p.name, err)
		}
		*p.kv = kv
	}
	logs, err := OpenTurnLogs(ctx, js)
	if err != nil {
		return Buckets{}, err
	}
	b.TurnLogs = logs
	return b, nil
}
