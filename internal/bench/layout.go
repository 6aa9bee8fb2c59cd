package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/groupcommit"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The layout phase (BENCH_PHASES=layout, not in AllPhases) measures storage
// layouts for the group committer on the raw turn, before any of them is
// built into Tollgate (docs/bench.md, "Group commit"). An atomic batch is one
// stream's and costs a fixed number of disk flushes, so it pays only when
// many writes wait on one stream at once; today a turn's writes are spread
// over nine streams and buckets. The layouts:
//
//   - today: the raw turn as it is (every write acknowledged alone);
//   - today, group commit: the same writes through a group committer
//     (jetstream/groupcommit, the configuration Tollgate uses), one per
//     stream;
//   - state stream, group commit: the four buckets the stages write on a
//     turn's path (approvals, batches, sessions, claims) as one bucket,
//     stateBucket, their records under typed key prefixes ("batches.<turn>"),
//     so that every KV write of every turn in flight meets on one stream;
//   - state stream, fewer writes, group commit: the same, and a turn makes
//     the writes the two cheap levers leave (fewerWrites);
//   - today, fewer writes: the levers alone.
//
// The stream publishes (inbound, accepted turns, decisions, events) stay on
// their streams in every layout: they are the inputs of the stages'
// durable consumers.
const phaseLayout = "layout"

// stateBucket is the layout phase's one bucket for the stages' records.
const stateBucket = "tollgate_state"

// rawLayout is how the raw turn stores its writes.
type rawLayout struct {
	groupCommit bool // writes go through a group committer
	state       bool // the four hot buckets are one (stateBucket)
	fewer       bool // the sequence without the writes fewerWrites drops
}

// String names the layout in the figures.
func (l rawLayout) String() string {
	name := "raw turn, today's layout"
	if l.state {
		name = "raw turn, state stream"
	}
	if l.fewer {
		name += ", fewer writes"
	}
	if l.groupCommit {
		name += ", group commit"
	}
	return name
}

// stateBuckets are the buckets the state layout folds into stateBucket.
var stateBuckets = map[string]bool{
	topology.BucketApprovals: true, topology.BucketBatches: true,
	topology.BucketSessions: true, topology.BucketClaims: true,
}

// place returns the bucket and key that bucket/key of the traced sequence
// is stored under in layout l.
func (l rawLayout) place(bucket, key string) (string, string) {
	if l.state && stateBuckets[bucket] {
		return stateBucket, strings.TrimPrefix(bucket, "tollgate_") + "." + key
	}
	return bucket, key
}

// stateBucketStream is stateBucket's stream, configured as Tollgate's
// bucket streams are on st (allow_atomic among them).
func stateBucketStream(st storage) jetstream.StreamConfig {
	sc := st.topology().BucketStreams()[0]
	sc.Name, sc.Subjects, sc.Description = "KV_"+stateBucket, []string{"$KV." + stateBucket + ".>"}, "bench: the state-stream layout"
	return sc
}

// fewerWrites is seq without the writes two levers would remove:
//
//   - a batch created already running when its session is free: the
//     executor's update of the batch record right after it acquired the
//     session (queued -> running) goes;
//   - an execution claim's result kept only in the batch record, which is
//     written with it in the same step today: the claim's update with the
//     result goes (the claim is created, durable, before its tool runs).
//
// Fast turn 10 -> 8 writes, approval turn 21 -> 18.
func fewerWrites(seq []step) []step {
	var out []step
	for i, s := range seq {
		bucket, _, _ := strings.Cut(s.On, "/")
		switch {
		case s.Op == "kv.update" && bucket == topology.BucketClaims:
			continue
		case s.Op == "kv.update" && bucket == topology.BucketBatches && i > 0 &&
			seq[i-1].Stage == s.Stage && seq[i-1].Op == "kv.update" && strings.HasPrefix(seq[i-1].On, topology.BucketSessions+"/") && s.Stage == "executor":
			continue
		}
		out = append(out, s)
	}
	return out
}

// ensureLayout creates what layout l needs beyond Tollgate's topology.
func ensureLayout(ctx context.Context, js jetstream.JetStream, st storage, l rawLayout) error {
	if !l.state {
		return nil
	}
	if _, err := js.CreateOrUpdateStream(ctx, stateBucketStream(st)); err != nil {
		return fmt.Errorf("layout: state bucket: %w", err)
	}
	return nil
}

// rawWriter makes the raw stages' writes in a layout other than today's
// unbatched one: every stream publish and KV create or update is a publish
// (a KV write with Nats-Expected-Last-Subject-Sequence, as nats.go's
// KeyValue makes it), through the committer when there is one.
type rawWriter struct {
	js      jetstream.JetStream
	gc      *groupcommit.Committer
	streams []jetstream.StreamConfig // what gc commits
}

// newRawWriter returns the writer of layout l on js.
func newRawWriter(js jetstream.JetStream, st storage, l rawLayout) (*rawWriter, error) {
	w := &rawWriter{js: js}
	if !l.groupCommit {
		return w, nil
	}
	w.streams = append(st.topology().Streams(), st.topology().BucketStreams()...)
	if l.state {
		w.streams = append(w.streams, stateBucketStream(st))
	}
	gc, err := groupcommit.New(js, groupcommit.Config{Streams: w.streams})
	if err != nil {
		return nil, err
	}
	w.gc = gc
	return w, nil
}

// logStats logs, for each stream the committer wrote to, its batches and
// single writes.
func (w *rawWriter) logStats(logf func(string, ...any), what string) {
	if w == nil || w.gc == nil {
		return
	}
	for _, sc := range w.streams {
		if gs := w.gc.Stats(sc.Name); gs.Batches+gs.SingleWrites > 0 {
			logf("bench: %s %s: %d batches of %d writes, %d single, %d refused", what, sc.Name, gs.Batches, gs.BatchedWrites, gs.SingleWrites, gs.Refused)
		}
	}
}

// publish stores m and returns its acknowledgement.
func (w *rawWriter) publish(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	if w.gc != nil {
		return w.gc.PublishMsg(ctx, m)
	}
	return w.js.PublishMsg(ctx, m)
}

// errWrongLast is a KV compare-and-set that failed (the key exists, or is
// at another revision).
var errWrongLast = errors.New("wrong last sequence")

// kvWrite creates (rev 0) or updates (at rev) bucket's key.
func (w *rawWriter) kvWrite(ctx context.Context, bucket, key string, value []byte, rev uint64) (uint64, error) {
	m := nats.NewMsg("$KV." + bucket + "." + key)
	m.Data = value
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	ack, err := w.publish(ctx, m)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, fmt.Errorf("%s/%s: %w", bucket, key, errWrongLast)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// rawTurnLayout measures the raw turn of p, all-in-one, in layout l.
func (b *bencher) rawTurnLayout(p path, st storage, l rawLayout) (sample, error) {
	e, js, done, err := b.envConn(st, "bench-raw-stages")
	if err != nil {
		return sample{}, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ensureLayout(ctx, js, st, l); err != nil {
		return sample{}, err
	}
	seq := b.seqs[p]
	if l.fewer {
		seq = fewerWrites(seq)
	}
	r, err := startRawStagesIn(js, seq, p, st, l)
	if err != nil {
		return sample{}, err
	}
	defer r.close()
	s, err := b.drive(e, p, true, nil, nil)
	r.w.logStats(b.cfg.Logf, p.String()+" "+l.String())
	s.Errors += r.errs.Load()
	s.Conflicts = r.conflicts.Load()
	if v := r.lastErr.Load(); v != nil {
		b.cfg.Logf("bench: raw %s turn (%s): %d errors, last: %v", p, l, r.errs.Load(), v)
	}
	return s, err
}

// layouts is the layout phase: the raw turn of both paths in each layout,
// interleaved round by round so that every layout sees the same machine
// load, with sync_interval: always (where an acknowledged write costs an
// fsync, the cost the layouts differ in) and then in the default flush
// mode.
func (b *bencher) layouts(ctx context.Context, r *Report) {
	ls := []rawLayout{{}, {fewer: true}, {groupCommit: true}, {groupCommit: true, state: true}, {groupCommit: true, state: true, fewer: true}}
	for _, st := range []storage{singleSynced, single} {
		var sc []scenario
		for _, p := range []path{fastPath, approvalPath} {
			for _, l := range ls {
				sc = append(sc, scenario{name: l.String(), mode: modeAllInOne, unit: "turns/s", path: &p,
					run: func() (sample, error) { return b.rawTurnLayout(p, st, l) }})
			}
		}
		b.measure(ctx, r, st, sc)
	}
}
