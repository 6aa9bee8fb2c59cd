// Package replay re-reads Tollgate's streams over a range of turns and
// compares what they say with what KV holds: the approval and batch
// records are a projection of TOLLGATE_TURNS and TOLLGATE_EVENTS, with
// each turn's outcome (how its batch ended) from its turn log's outcome
// event where the log keeps it (every batch kept in a turn log: its
// outcome is published nowhere), else from tollgate.event.turn.outcome
// (Read). So after an incident (a bucket deleted, purged or restored from
// an old backup) they can be rebuilt from the streams alone.
//
// The batch of a turn accepted since the turn logs (issue 36) is not in KV:
// it is its turn's log, a stream (TOLLGATE_TURNLOG_<partition>), whose last
// event is the batch. That log is a source of truth like the other
// streams: a run reads it, reports the batch Unchanged from it (and judges
// that record in the dry run), and never rebuilds or writes it. What
// tollgate_batches holds is only the batches earlier versions wrote there
// (version 1, or version 2 before the turn logs); losing the bucket loses
// only those, and a rebuild writes them back into it from TOLLGATE_TURNS
// and TOLLGATE_EVENTS under the rule below. A turn whose log has no event
// (or whose turn-log stream is missing: warned about) is judged against
// the bucket the same way: an earlier version's batch, one never written,
// or one lost with its log's stream (deleted and made again), rebuilt into
// the bucket, where the stages find it after its empty log.
//
// Run has three modes:
//
//   - report (default): read the streams, compare with KV, write nothing;
//     the report says what a rebuild would change.
//   - rebuild: write what the streams prove and KV lacks, under the rule
//     below, then nudge each turn whose records it wrote so its stages pick
//     it up again.
//   - dry-run (shadow redrive): report what the redriver would do with each
//     batch (started, deferred or failed, and why; and for a started batch
//     what each approved call would do) on the records a rebuild would
//     leave, using the redriver's own decision functions
//     (redriver.Evaluate, redriver.PlanCall). It never writes KV, never
//     publishes and never runs a tool.
//
// The rebuild rule: a record is only ever created where its key is missing
// (KV create), or moved forward where KV holds an older stage of it
// (compare-and-set on the revision read): a batch whose state is earlier in
// queued < running < awaiting < started < completed|failed, an approval
// still pending that the streams say was decided. A record at the same
// stage or further, one that does not decode (or is a version 1 approval,
// left to the compatibility path), and one whose TurnContext or calls
// differ from the streams' (a conflict, reported) is left alone. So a
// rebuild never overwrites a record newer than the streams, and a second
// replay changes nothing. Missing session records of sessions with
// unfinished turns are created (create-only), and so are the standing
// grants made on the replayed turns, from their grant events (grants.go);
// execution claims
// (tollgate_claims, which only version 1 batches have) are never written
// or deleted: they are what keeps a
// call from running twice: a rebuild refuses to run without the bucket, and
// every run warns about a call the streams say ran that has no claim.
//
// Sealed TurnContexts are copied as published, never re-derived or
// re-sealed. The streams are trusted as much as KV: whoever may publish on
// tollgate.event.> could, through a rebuild, write approval records; keep
// that right to the stages (deploy/nats/least-privilege.conf).
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Options configures Run.
type Options struct {
	Range Range
	// Rebuild writes KV (and nudges the turns it wrote). Without Rebuild
	// or DryRun, Run only reports.
	Rebuild bool
	// DryRun adds a shadow redrive of every batch; it writes nothing.
	// Exclusive with Rebuild.
	DryRun bool
	// Keys and Policy are what the redriver and the approver judge with:
	// required for DryRun (the seal check and the policy re-check). Given,
	// a decision no stream keeps (the approvals bucket lost) is judged
	// again from TOLLGATE_DECISIONS (ReadJudging); without them such an
	// approval comes back pending. A rebuild copies contexts, it does not
	// verify them.
	Keys   *seal.KeyRing
	Policy *policy.Policy
	// Topology is used to create missing approval, batch and session
	// buckets on Rebuild; zero means topology.DefaultConfig().
	Topology topology.Config
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Now defaults to time.Now (session records' updated_at, notices).
	Now func() time.Time
}

// Mode names, as in Report.Mode.
const (
	ModeReport  = "report"
	ModeRebuild = "rebuild"
	ModeDryRun  = "dry-run"
)

// Report is what a Run found and did.
type Report struct {
	Mode  string       `json:"mode"`
	Turns []TurnReport `json:"turns"`
	// Sessions are the session records considered (sessions with an
	// unfinished turn).
	Sessions []Change `json:"sessions,omitempty"`
	// Grants are the standing grants made on the range's turns, and the
	// index records that list them (see grants.go).
	Grants []Change `json:"grants,omitempty"`
	// Changes counts KV keys created or updated (rebuild), or that a
	// rebuild would create or update (report, dry-run). Zero means KV
	// already holds everything the streams say.
	Changes int `json:"changes"`
	// Conflicts counts records left alone because KV and the streams
	// disagree on their authority or final state: look at them.
	Conflicts int `json:"conflicts"`
	// Notices counts the nudges a rebuild published.
	Notices int `json:"notices"`
	// Skipped are stream messages that could not be used.
	Skipped []string `json:"skipped,omitempty"`
	// Warnings concern the whole run (e.g. a missing bucket).
	Warnings []string `json:"warnings,omitempty"`
}

// TurnReport is one turn of a Report.
type TurnReport struct {
	TurnID    string             `json:"turn_id"`
	SessionID string             `json:"session_id"`
	Seq       uint64             `json:"turns_seq"`
	Accepted  time.Time          `json:"accepted_at"`
	State     schemas.BatchState `json:"state"` // the batch state the streams say
	Batch     Change             `json:"batch"`
	Approvals []Change           `json:"approvals,omitempty"`
	// Notice is the subject of the nudge a rebuild published, if any.
	Notice string `json:"notice,omitempty"`
	// Shadow is the dry-run verdict.
	Shadow *Shadow  `json:"shadow,omitempty"`
	Notes  []string `json:"notes,omitempty"`
	rec    *schemas.BatchRecord
	recs   map[string]*schemas.ApprovalRecord
}

// Run reads the turns of o.Range (Read), compares their records with KV
// and, per the mode (see the package documentation), writes, shadows a
// redrive, or only reports. It returns an error only when it could not do
// that (the server, a stream, a missing claims bucket on Rebuild); what it
// found record by record is in the Report.
func Run(ctx context.Context, js jetstream.JetStream, o Options) (*Report, error) {
	switch {
	case o.Rebuild && o.DryRun:
		return nil, errors.New("replay: rebuild and dry-run exclude each other (a dry run writes nothing)")
	case o.DryRun && (o.Keys == nil || o.Policy == nil):
		return nil, errors.New("replay: a dry run needs the seal keys and the policy the redriver uses")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Topology == (topology.Config{}) {
		o.Topology = topology.DefaultConfig()
	}
	rep := &Report{Mode: ModeReport, Turns: []TurnReport{}}
	switch {
	case o.Rebuild:
		rep.Mode = ModeRebuild
	case o.DryRun:
		rep.Mode = ModeDryRun
	}
	b, err := openBuckets(ctx, js, o, rep)
	if err != nil {
		return nil, err
	}
	var j *Judge
	if o.Policy != nil && o.Keys != nil {
		j = &Judge{Policy: o.Policy, Keys: o.Keys}
	}
	h, err := read(ctx, js, o.Range, j)
	if err != nil {
		return nil, err
	}
	a := &applier{js: js, b: b, o: o, rep: rep, run: strconv.FormatInt(o.Now().UnixNano(), 36)}
	if err := a.apply(ctx, h); err != nil {
		return nil, err
	}
	if err := a.grants(ctx, h); err != nil {
		return nil, err
	}
	rep.Skipped = h.Skipped // after the grant scan, which skips too
	if o.DryRun {
		if err := shadowAll(ctx, b, o, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// buckets are the KV handles a run uses; a nil handle is a missing bucket
// (every key reads as absent). logs are the turn-log streams by partition
// (nil when missing: the logs of its turns read as empty) and turnLogs
// their Log (nil when every stream is missing).
type buckets struct {
	approvals, batches, sessions, claims, grants jetstream.KeyValue

	logs     []jetstream.Stream
	turnLogs *turnlog.Log
}

// bucketStream is the configuration of bucket's stream in c.
func bucketStream(c topology.Config, bucket string) jetstream.StreamConfig {
	i := slices.IndexFunc(c.BucketStreams(), func(sc jetstream.StreamConfig) bool { return sc.Name == "KV_"+bucket })
	return c.BucketStreams()[i]
}

// openBuckets binds the buckets. On Rebuild it creates a missing
// approvals, batches or sessions bucket (create only: an existing one is
// never reconfigured) and refuses to go on without tollgate_claims.
func openBuckets(ctx context.Context, js jetstream.JetStream, o Options, rep *Report) (*buckets, error) {
	b := &buckets{}
	for _, kc := range o.Topology.Buckets() {
		kv, err := js.KeyValue(ctx, kc.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			switch {
			case kc.Bucket == topology.BucketClaims && o.Rebuild:
				return nil, fmt.Errorf("replay: bucket %s is missing: the execution claims are what say which calls already ran, and a rebuild without them could let a call run twice; restore the bucket (or its stream KV_%s) first", kc.Bucket, kc.Bucket)
			case kc.Bucket == topology.BucketClaims:
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("bucket %s is missing: no call shows as already run, and a rebuild would refuse to run", kc.Bucket))
			case o.Rebuild:
				// Created as topology.Ensure would create it (its stream
				// allows the TTLs ended records are written with).
				_, err = js.CreateStream(ctx, bucketStream(o.Topology, kc.Bucket))
				if err == nil {
					rep.Warnings = append(rep.Warnings, fmt.Sprintf("bucket %s was missing: created", kc.Bucket))
				}
				if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // or created meanwhile by a starting stage
					kv, err = js.KeyValue(ctx, kc.Bucket)
				}
			default:
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("bucket %s is missing: every record in it reads as absent", kc.Bucket))
				err = nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("replay: open bucket %s: %w", kc.Bucket, err)
		}
		switch kc.Bucket {
		case topology.BucketApprovals:
			b.approvals = kv
		case topology.BucketBatches:
			b.batches = kv
		case topology.BucketSessions:
			b.sessions = kv
		case topology.BucketClaims:
			b.claims = kv
		case topology.BucketGrants:
			b.grants = kv
		}
	}
	return b, openTurnLogs(ctx, js, b, rep)
}

// openTurnLogs binds the turn-log streams (turnLogStreams), read only: a
// turn's log is the source of truth for its batch, never rebuilt and never
// written by a run. A missing stream is warned about, and the logs it held
// read as empty: the batches of its turns are judged against the batches
// bucket, as an earlier version's, and a rebuild writes the ones the
// streams prove there.
func openTurnLogs(ctx context.Context, js jetstream.JetStream, b *buckets, rep *Report) error {
	logs, missing, err := turnLogStreams(ctx, js)
	switch {
	case err != nil:
		return err
	case logs == nil:
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("the turn-log streams (%s*) are missing: every turn's log reads as empty, and every batch is judged (and rebuilt) in bucket %s as an earlier version's; provision the topology to create them again", topology.StreamTurnLogPrefix, topology.BucketBatches))
		return nil
	}
	for _, name := range missing {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("turn-log stream %s is missing: the logs it held read as empty, and the batches of its turns are judged (and rebuilt) in bucket %s as an earlier version's; provision the topology to create the stream again", name, topology.BucketBatches))
	}
	b.logs = logs
	// A turn's read checks for a missing partition first (turnLog):
	// turnlog.Log would read a nil stream.
	b.turnLogs = turnlog.Bind(js, logs)
	return nil
}

// turnLogStreams binds the turn-log streams as topology.OpenTurnLogs does
// (as many as stream 0's metadata says, whatever this process's
// configuration says), except that a missing stream is no error: logs is
// nil when stream 0 is missing (missing then names no stream: the number
// of partitions is unknown), and otherwise has a nil entry for each
// partition whose stream is missing, named in missing. Its error is the
// server's, or topology.ErrTurnLogPartitions for a stream 0 that records
// no valid number of partitions.
func turnLogStreams(ctx context.Context, js jetstream.JetStream) (logs []jetstream.Stream, missing []string, err error) {
	s0, err := js.Stream(ctx, topology.TurnLogStream(0))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("replay: open stream %s: %w", topology.TurnLogStream(0), err)
	}
	meta := s0.CachedInfo().Config.Metadata[topology.MetaTurnLogPartitions]
	p, err := strconv.Atoi(meta)
	if err != nil || p < 1 || p > topology.MaxTurnLogPartitions {
		return nil, nil, fmt.Errorf("replay: %w: stream %s records %q partitions", topology.ErrTurnLogPartitions, topology.TurnLogStream(0), meta)
	}
	logs = []jetstream.Stream{s0}
	for i := 1; i < p; i++ {
		s, err := js.Stream(ctx, topology.TurnLogStream(i))
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			missing = append(missing, topology.TurnLogStream(i))
			s = nil
		case err != nil:
			return nil, nil, fmt.Errorf("replay: open stream %s: %w", topology.TurnLogStream(i), err)
		}
		logs = append(logs, s) // nil when missing
	}
	return logs, missing, nil
}

// turnLog returns the stream of turn's log, nil when it is missing (or
// every turn-log stream is).
func (b *buckets) turnLog(turn string) jetstream.Stream {
	if len(b.logs) == 0 {
		return nil
	}
	return b.logs[topology.TurnLogPartition(turn, len(b.logs))]
}

// get reads key from kv; a missing bucket or key is jetstream.ErrKeyNotFound.
func get(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	if kv == nil {
		return nil, jetstream.ErrKeyNotFound
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, err
}
