package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The layout phase (BENCH_PHASES=layout, not in AllPhases) measures
// storage layouts on the raw turn, before any of them is built into
// Tollgate (docs/bench.md, "Group commit" and "One write per fact"). Every
// write is acknowledged alone. The layouts (BENCH_LAYOUTS, a
// comma-separated list of these names; the default is
// today,records,events):
//
//   - today: the raw turn as it is;
//   - state: the four buckets the stages write on a turn's path
//     (approvals, batches, sessions, claims) as one bucket, stateBucket,
//     their records under typed key prefixes ("batches.<turn>"), so that
//     every KV write of every turn in flight is on one stream (today's
//     batch records are in the turn logs, which stay where they are: the
//     KV writes left are the approvals' and sessions'; docs/bench.md
//     records it measured through the group committer an earlier version
//     had);
//   - records: design (a) of one write per fact, records are the log
//     (rawseq.go: recordsFast, recordsApproval);
//   - events: design (b), the turn's events are the log (eventsFast,
//     eventsApproval).
//
// records and events spread their state writes (the batch records, the
// turn logs) over P streams by a hash of the turn id, and are measured at
// each P of BENCH_LAYOUT_PARTITIONS (comma-separated; default 1,4). The
// stream publishes (inbound, accepted turns, decisions) stay on their
// streams in every layout: they are the inputs of the stages' durable
// consumers.
const phaseLayout = "layout"

// stateBucket is the layout phase's one bucket for the stages' records.
const stateBucket = "tollgate_state"

// design is how a layout stores a turn's facts.
type design int

const (
	designToday   design = iota // today's sequence (rawseq.go)
	designRecords               // (a) records are the log
	designEvents                // (b) the turn's events are the log
)

// rawLayout is how the raw turn stores its writes.
type rawLayout struct {
	state      bool // the four hot buckets are one (stateBucket)
	design     design
	partitions int // records and events: P, the streams the state writes are spread over
}

// layoutKinds are the layouts BENCH_LAYOUTS names (records and events
// get their partitions from BENCH_LAYOUT_PARTITIONS).
var layoutKinds = map[string]rawLayout{
	"today": {}, "state": {state: true},
	"records": {design: designRecords}, "events": {design: designEvents},
}

// String names the layout in the figures.
func (l rawLayout) String() string {
	switch l.design {
	case designRecords:
		return fmt.Sprintf("raw turn, (a) records are the log, P=%d", l.partitions)
	case designEvents:
		return fmt.Sprintf("raw turn, (b) the turn's events are the log, P=%d", l.partitions)
	}
	if l.state {
		return "raw turn, state stream"
	}
	return "raw turn, today's layout"
}

// oneWritePerFact reports whether l is one of the two designs.
func (l rawLayout) oneWritePerFact() bool { return l.design != designToday }

// sequence is the raw sequence of p in l; today's is traced (b.seqs).
func (l rawLayout) sequence(p path, today []step) []step {
	switch {
	case l.design == designRecords && p == approvalPath:
		return recordsApproval
	case l.design == designRecords:
		return recordsFast
	case l.design == designEvents && p == approvalPath:
		return eventsApproval
	case l.design == designEvents:
		return eventsFast
	}
	return today
}

// part is the partition of the state writes of turn (0 to P-1), as
// the product partitions its turn logs (topology.TurnLogPartition).
func (l rawLayout) part(turn string) int {
	if l.partitions <= 1 {
		return 0
	}
	return topology.TurnLogPartition(turn, l.partitions)
}

// batchBucket is design (a)'s batch bucket of partition i.
func batchBucket(i int) string { return topology.BucketBatches + "_" + strconv.Itoa(i) }

// turnLogStream is design (b)'s turn-log stream of partition i, which
// holds the subjects tollgate.turnlog.<i>.<turn>.<fact>: the product's
// (topology.TurnLogStream).
func turnLogStream(i int) string { return topology.TurnLogStream(i) }

// turnLogPrefix starts the subjects of partition i's turn logs.
func turnLogPrefix(i int) string { return topology.SubjectTurnLogPrefix + strconv.Itoa(i) + "." }

// turnWildcard is the wildcard of the turn whose event subject is
// subject: tollgate.turnlog.<p>.<turn>.>.
func turnWildcard(subject string) string {
	return subject[:strings.LastIndexByte(subject, '.')] + ".>"
}

// buckets are the KV buckets the raw stages of l write or read.
func (l rawLayout) buckets() []string {
	b := []string{topology.BucketApprovals, topology.BucketBatches, topology.BucketSessions, topology.BucketClaims, topology.BucketGrants}
	if l.state {
		b = append(b, stateBucket)
	}
	if l.design == designRecords {
		for i := range l.partitions {
			b = append(b, batchBucket(i))
		}
	}
	return b
}

// stageConfigs are the consumers that trigger l's raw stages. Today's
// are Tollgate's (rawStageConfigs). In the two designs the executor takes
// only accepted turns (no ready notices: no session record), and the
// redriver, instead of the event publishes, consumes the change streams
// of the approvals bucket and of the batch buckets (a) or the turn logs'
// awaiting events (b), one durable consumer each.
func (l rawLayout) stageConfigs() rawConfigs {
	if !l.oneWritePerFact() {
		if !l.state {
			return rawStageConfigs
		}
		// The approvals are keys of the state stream: the redriver's
		// durable on their revisions follows them there.
		out := maps.Clone(rawStageConfigs)
		r := out["redriver"]
		r.sources = append([]rawSource{{"KV_" + stateBucket, []string{"$KV." + stateBucket + "." + strings.TrimPrefix(topology.BucketApprovals, "tollgate_") + ".>"}}}, r.sources[1:]...)
		out["redriver"] = r
		return out
	}
	approvals := rawSource{"KV_" + topology.BucketApprovals, []string{"$KV." + topology.BucketApprovals + ".>"}}
	redriver := []rawSource{approvals}
	for i := range l.partitions {
		if l.design == designRecords {
			redriver = append(redriver, rawSource{"KV_" + batchBucket(i), []string{"$KV." + batchBucket(i) + ".>"}})
		} else {
			redriver = append(redriver, rawSource{turnLogStream(i), []string{turnLogPrefix(i) + "*." + factAwaiting}})
		}
	}
	return map[string]rawStageConfig{
		"ingest":   rawStageConfigs["ingest"],
		"executor": {sources: []rawSource{{topology.StreamTurns, []string{topology.SubjectTurnAccepted + "*"}}}, concurrency: rawStageConfigs["executor"].concurrency},
		"approver": streamApprover,
		"redriver": {sources: redriver, concurrency: rawStageConfigs["redriver"].concurrency},
	}
}

// watches are the KV watches l's raw stages hold, by stage: the
// approver's of the approvals (its pending set and expiry), and today
// the redriver's of the batches (the recovery sweep: with it, the watch
// of the turn logs, rawStages.watchLogs), which the designs' durable
// consumers of the change streams replace.
func (l rawLayout) watches() map[string]string {
	if l.oneWritePerFact() {
		return map[string]string{"approver": topology.BucketApprovals}
	}
	return map[string]string{"approver": topology.BucketApprovals, "redriver": topology.BucketBatches}
}

// factSubjects are where the driver sees the two designs' outcomes and
// approval requests (the writes whose Bench-Fact is outcome or
// requested), in place of today's event publishes.
func (l rawLayout) factSubjects() []string {
	if !l.oneWritePerFact() {
		return nil
	}
	subs := []string{"$KV." + topology.BucketApprovals + ".*"}
	if l.design == designEvents {
		return append(subs, "tollgate.turnlog.*.*."+factOutcome)
	}
	for i := range l.partitions {
		subs = append(subs, "$KV."+batchBucket(i)+".*")
	}
	return subs
}

// stateBuckets are the buckets the state layout folds into stateBucket.
var stateBuckets = map[string]bool{
	topology.BucketApprovals: true, topology.BucketBatches: true,
	topology.BucketSessions: true, topology.BucketClaims: true,
}

// place returns the bucket and key that bucket/key of the traced sequence
// is stored under in layout l: in the state layouts, stateBucket; in
// design (a), a batch record in its turn's partition of the batch
// buckets.
func (l rawLayout) place(bucket, key string) (string, string) {
	switch {
	case l.state && stateBuckets[bucket]:
		return stateBucket, strings.TrimPrefix(bucket, "tollgate_") + "." + key
	case l.design == designRecords && bucket == topology.BucketBatches:
		return batchBucket(l.part(key)), key
	}
	return bucket, key
}

// bucketStreamAs is the stream of Tollgate's bucket like on st (the first
// bucket stream if like is not one), renamed to bucket's.
func bucketStreamAs(st storage, like, bucket, desc string) jetstream.StreamConfig {
	all := st.topology().BucketStreams()
	sc := all[0]
	for _, c := range all {
		if c.Name == "KV_"+like {
			sc = c
		}
	}
	sc.Name, sc.Subjects, sc.Description = "KV_"+bucket, []string{"$KV." + bucket + ".>"}, desc
	return sc
}

// stateBucketStream is stateBucket's stream, configured as Tollgate's
// bucket streams are on st.
func stateBucketStream(st storage) jetstream.StreamConfig {
	return bucketStreamAs(st, "", stateBucket, "bench: the state-stream layout")
}

// The layouts "fewer" and "state-fewer" measured two levers before they
// were built (docs/bench.md, "Two writes fewer"): execution claims kept in
// the batch record, and a batch created already running when its session
// is free. Both are today's sequence now, so the layouts are gone.

// ensureLayout creates what layout l needs beyond Tollgate's topology:
// the state bucket, design (a)'s P batch buckets (configured as Tollgate's
// batches bucket), design (b)'s P turn-log streams (as Tollgate's
// streams).
func ensureLayout(ctx context.Context, js jetstream.JetStream, st storage, l rawLayout) error {
	var scs []jetstream.StreamConfig
	if l.state {
		scs = append(scs, stateBucketStream(st))
	}
	for i := range l.partitions {
		switch l.design {
		case designRecords:
			scs = append(scs, bucketStreamAs(st, topology.BucketBatches, batchBucket(i), "bench: design (a)'s batch records, a partition"))
		case designEvents:
			sc := rawStreamConfig(st, turnLogStream(i), turnLogPrefix(i)+">")
			sc.Description = "bench: design (b)'s turn logs, a partition"
			scs = append(scs, sc)
		}
	}
	for _, sc := range scs {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("layout: stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// rawWriter makes the raw stages' writes in a layout other than today's:
// every stream publish and KV create or update is a publish (a KV write
// with Nats-Expected-Last-Subject-Sequence, as nats.go's KeyValue makes
// it), acknowledged alone.
type rawWriter struct {
	js      jetstream.JetStream
	handles sync.Map // stream name -> jetstream.Stream, for read-backs
	// send, if set, stores a write instead of publish's client (tests:
	// a lost acknowledgement).
	send func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error)
	// retries counts attempts after the first (a write whose
	// acknowledgement did not come), own the refused writes recognised as
	// the writer's own.
	retries, own atomic.Int64
}

// logStats logs the writer's retries and recognised own writes.
func (w *rawWriter) logStats(logf func(string, ...any), what string) {
	if w == nil {
		return
	}
	if n, o := w.retries.Load(), w.own.Load(); n+o > 0 {
		logf("bench: %s: %d retried writes, %d refused writes recognised as the writer's own", what, n, o)
	}
}

// publish stores m and returns its acknowledgement.
func (w *rawWriter) publish(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	if w.send != nil {
		return w.send(ctx, m)
	}
	return w.js.PublishMsg(ctx, m)
}

// errWrongLast is a compare-and-set that failed: the key exists or is at
// another revision, or the turn's log has moved on (error 10071).
var errWrongLast = errors.New("wrong last sequence")

// casWrite is one compare-and-set write.
type casWrite struct {
	stream  string // the stream that stores subject (read back on a refusal)
	subject string
	// last is the subject, or wildcard, whose last sequence must be rev
	// (Nats-Expected-Last-Subject-Sequence-Subject); "" is subject itself.
	last string
	rev  uint64
	// msgID identifies this write (Nats-Msg-Id), so that the writer can
	// recognise it once stored; "" leaves it out (and a refusal is a
	// conflict).
	msgID  string
	header nats.Header // more headers
	data   []byte
}

// casAttempts bounds the attempts of one write whose acknowledgement does
// not come; casAttemptTimeout bounds each.
const (
	casAttempts       = 3
	casAttemptTimeout = 5 * time.Second
)

// cas makes the write c and returns its stream sequence. A publish that
// gets no acknowledgement (a timeout, no responders) is sent again, the
// same message with the same message id. nats-server checks the
// compare-and-set before the message id, so an attempt whose predecessor
// was stored is refused with 10071 (wrong last sequence), not answered as
// a duplicate; so is a write made again after a redelivery. On a refusal
// the writer reads back the last message of c's subject (or wildcard):
// if it carries c's message id, the write is its own, stored, and its
// sequence is returned; otherwise the refusal is a conflict
// (errWrongLast).
func (w *rawWriter) cas(ctx context.Context, c casWrite) (uint64, error) {
	m := nats.NewMsg(c.subject)
	m.Data = c.data
	for k, v := range c.header {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(c.rev, 10))
	if c.last != "" && c.last != c.subject {
		m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, c.last)
	}
	if c.msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, c.msgID)
	}
	var err error
	for attempt := range casAttempts {
		if attempt > 0 {
			w.retries.Add(1)
		}
		actx, cancel := context.WithTimeout(ctx, casAttemptTimeout)
		var ack *jetstream.PubAck
		ack, err = w.publish(actx, m)
		cancel()
		switch {
		case err == nil:
			return ack.Sequence, nil
		case wrongLast(err):
			if seq, ok := w.stored(ctx, c); ok {
				w.own.Add(1)
				return seq, nil
			}
			return 0, fmt.Errorf("%s: %w", c.subject, errWrongLast)
		case ctx.Err() != nil || !retryable(err):
			return 0, err
		}
	}
	return 0, err
}

// wrongLast reports a refused compare-and-set (10071).
func wrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// retryable reports a publish whose outcome is unknown: it may have been
// stored.
func retryable(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// stored reads back the last message of c's subject (or wildcard) and
// returns its sequence if it is c (its subject and message id).
func (w *rawWriter) stored(ctx context.Context, c casWrite) (uint64, bool) {
	if c.msgID == "" || c.stream == "" {
		return 0, false
	}
	var s jetstream.Stream
	if v, ok := w.handles.Load(c.stream); ok {
		s = v.(jetstream.Stream)
	} else {
		var err error
		if s, err = w.js.Stream(ctx, c.stream); err != nil {
			return 0, false
		}
		w.handles.Store(c.stream, s)
	}
	last := c.last
	if last == "" {
		last = c.subject
	}
	msg, err := s.GetLastMsgForSubject(ctx, last)
	if err != nil || msg.Subject != c.subject || msg.Header.Get(jetstream.MsgIDHeader) != c.msgID {
		return 0, false
	}
	return msg.Sequence, true
}

// kvWrite creates (rev 0) or updates (at rev) bucket's key, with the
// message id msgID ("": none) and the headers h.
func (w *rawWriter) kvWrite(ctx context.Context, bucket, key string, value []byte, rev uint64, msgID string, h nats.Header) (uint64, error) {
	return w.cas(ctx, casWrite{stream: "KV_" + bucket, subject: "$KV." + bucket + "." + key, rev: rev, msgID: msgID, header: h, data: value})
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
	r, err := startRawStagesIn(js, l.sequence(p, b.seqs[p]), p, l)
	if err != nil {
		return sample{}, err
	}
	defer r.close()
	s, err := b.drive(e, p, true, nil, nil, l.factSubjects()...)
	r.w.logStats(b.cfg.Logf, p.String()+" "+l.String())
	if r.log != nil {
		if st := r.log.Stats(); st.Retries+st.Own > 0 {
			b.cfg.Logf("bench: %s %s: turn logs: %d retried appends, %d refused appends recognised as the writer's own", p, l, st.Retries, st.Own)
		}
	}
	s.Errors += r.errs.Load()
	s.Conflicts = r.conflicts.Load()
	s.Retries = float64(r.retries.Load())
	if v := r.lastErr.Load(); v != nil {
		b.cfg.Logf("bench: raw %s turn (%s): %d errors, last: %v", p, l, r.errs.Load(), v)
	}
	if n := r.waits.Load(); n > 0 {
		b.cfg.Logf("bench: raw %s turn (%s): %d turns waited for their predecessor", p, l, n)
	}
	return s, err
}

// layouts is the layout phase: the raw turn of both paths in each layout
// of Config.Layouts (records and events at each of
// Config.LayoutPartitions), interleaved round by round so that every
// layout sees the same machine load, with sync_interval: always (where an
// acknowledged write costs an fsync, the cost the layouts differ in) and
// then in the default flush mode.
func (b *bencher) layouts(ctx context.Context, r *Report) {
	for _, st := range []storage{singleSynced, single} {
		var sc []scenario
		for _, p := range []path{fastPath, approvalPath} {
			for _, l := range b.cfg.rawLayouts() {
				sc = append(sc, scenario{name: l.String(), mode: modeAllInOne, unit: "turns/s", path: &p,
					run: func() (sample, error) { return b.rawTurnLayout(p, st, l) }})
			}
		}
		b.measure(ctx, r, st, sc)
	}
}

// rawLayouts are the layouts c measures.
func (c Config) rawLayouts() []rawLayout {
	var ls []rawLayout
	for _, name := range c.Layouts {
		l := layoutKinds[name]
		if !l.oneWritePerFact() {
			ls = append(ls, l)
			continue
		}
		for _, p := range c.LayoutPartitions {
			l.partitions = p
			ls = append(ls, l)
		}
	}
	return ls
}
