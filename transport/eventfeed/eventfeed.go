// Package eventfeed serves a process's live event streams (the gateway's
// Server-Sent Events, the web inbox's live updates, `tollgate chat`) from
// one set of consumers, made on first use: ordered consumers of
// TOLLGATE_EVENTS, of each turn-log partition's outcome and awaiting
// events (tollgate.turnlog.<i>.*.outcome and .awaiting, docs/protocol.md
// §4.2a) and of the approvals bucket's stream (KV_tollgate_approvals,
// every approval's revisions: topology.ApprovalRevisions). Their events
// are merged in the order they arrive and handed in memory to every
// subscriber whose subject filters they match.
//
// Each fact is made durable once (issue 36): a turn's outcome by the
// write that ends its batch in its turn's log, the approvals a batch
// requests by its move to awaiting there, an approval's decision by the
// revision of its record in tollgate_approvals that leaves pending. The
// feed hands each out as the event it replaces, byte for byte what is (or
// was) published on that subject: the outcome as
// tollgate.event.turn.outcome.<turn>, data the TurnOutcome alone
// (schemas.Encode); each request the awaiting event keeps, in the order it
// lists them, as tollgate.event.approval.requested.<turn>, data the
// ApprovalRecord (store.DecodeRequested, schemas.Encode); each decision as
// tollgate.event.approval.decided.<turn>, data the DecidedEvent
// (store.DecidedOf, schemas.Encode: Repeat empty). An awaiting event that
// keeps none (an earlier version's, or a second move to awaiting) stands
// for no event, nor does any revision but a decision (a pending record, a
// vote, a delete marker, a retire rewrite).
//
// A published copy is handed out only when the feed does not hand out the
// fact it copies. An outcome or a request: when its turn's log does not
// keep it (a batch kept in tollgate_batches, or a turn of an earlier
// version; this version's approval requests too, while they are still
// published). An approval.decided event without Repeat: when the bucket
// no longer holds its decision (a record of version 1, or one an earlier
// version decided and Retire wrote again), or holds it at or before the
// subscriber's origin (below). An approval.decided event with Repeat (the
// approver's answer to a decision that changed no record) is an event of
// its own, handed out as published. Each comes once.
//
// A subscriber's origin is where its reading of the bucket began before
// any of its events: the feed's position in the bucket when it
// subscribed with New; for an id of an earlier version (no approvals
// place), the position its TOLLGATE_EVENTS event was stored at
// (cursor.go); else 0. The approver stores a decision, then publishes its
// copy: a decision stored at or before the origin whose copy comes after
// the subscriber's place in TOLLGATE_EVENTS is handed out from the copy,
// all others from the bucket. An id this version handed out names no
// origin (0): a subscriber resuming from it has every decision the bucket
// holds from the bucket and passes over their copies. (A decision whose
// storing and publishing the client's first subscription fell between was
// stored before that subscription began: a resume does not hand out its
// copy either.)
//
// Order: each stream's events keep their order, so a turn's requests come
// before its outcome. A turn's outcome comes after every event of that
// turn stored before it ended (its approvals requested and decided, its
// redrives): the feed holds an outcome from a log until it has handed out
// the turn's last event in TOLLGATE_EVENTS at the time the outcome
// arrived (one direct get per outcome), and the bucket up to the latest
// revision of each approval the outcome's batch record lists (one direct
// get per approval: a decided record is never changed again, so that is
// its decision, stored before the outcome; for a failed batch also of the
// approval ids it may have created without recording them,
// schemas.ApprovalID, which its failure abandons). An approval's decided
// and voted events come after its request: the feed holds one whose
// request a log keeps until it has handed out that partition up to the
// awaiting event (one direct get per such event, and per published
// request, to read the awaiting event). A decision from the bucket whose
// request no log keeps yet, of a batch in its log that has not moved to
// awaiting (a standing grant's decision, written as its approval is
// created, before the move that keeps its request), waits for the turn's
// next event in that partition (the move, or the turn's end), for
// requestWait at most; one whose request no log keeps, until the feed
// has handed out TOLLGATE_EVENTS up to the turn's last published request
// (a direct get each). A published decided event without Repeat costs one
// more direct get, of its approval's revision. A stream's later events
// wait behind a held one. Should the waits go round in a circle, an
// outcome on the circle goes first: that takes a message stored after one
// that waits for it (an event of a turn stored after its outcome; a
// decision stored before its request), and only then can the outcome come
// before one of its turn's events. A subscriber catching up reads what
// the streams hold when it reads them: an event whose awaited message was
// stored after the feed's position when it subscribed (a request after
// its decision, in that moment) is not held for it.
//
// Each event carries the feed's position after it, a Cursor (the SSE id):
// a subscriber that starts there (Options.After) gets the events handed
// out after it and no other. The requests of one awaiting event share its
// sequence: each but the last carries a split position (cursor.go), which
// names the event and how many of its requests were out, so a subscriber
// resuming after one of them gets the next one, each once. A subscriber
// that starts behind the feed (a client resuming with Last-Event-ID, or a
// turn's stream from its first event) first reads the events it missed
// from the streams, through consumers of its own that are deleted as soon
// as it has caught up, by the same rules of order, then goes on with the
// feed's events: each event once, none missed.
//
// Each subscriber has a bounded buffer: one that does not keep up is cut
// off (Next answers ErrSlow) and never holds up the others; it resumes
// from its last event. The streams one owner (an API key, a signed-in
// person) holds open at once are capped: one more is refused with
// ErrTooManyStreams.
package eventfeed

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// CodeTooManyStreams is the reason code of ErrTooManyStreams.
const CodeTooManyStreams schemas.Code = "TOO_MANY_STREAMS"

var (
	// ErrTooManyStreams: the owner already holds its cap of open streams.
	ErrTooManyStreams = schemas.Errorf(CodeTooManyStreams, "too many event streams open at once")
	// ErrSlow: the subscriber's buffer filled up; it was cut off. It may
	// subscribe again after the last event it had.
	ErrSlow = errors.New("eventfeed: the subscriber fell behind and was cut off")
	// ErrClosed: the feed was closed.
	ErrClosed = errors.New("eventfeed: the feed was closed")
)

// Subjects is what the feed follows of TOLLGATE_EVENTS: every subject.
const Subjects = "tollgate.event.>"

// Buffer is how many events a subscriber's buffer holds by default.
const Buffer = 256

// replayBatch is how many missed events a subscriber reads at once from
// each stream.
const replayBatch = 256

// replayIdle is how long the server keeps a catching-up subscriber's
// consumer after its last use, should its deletion fail.
const replayIdle = 30 * time.Second

// lookupWait bounds the feed's reads of a turn's events and outcome.
const lookupWait = 5 * time.Second

// requestWait bounds how long the feed holds a decision stored before its
// batch moved to awaiting (a standing grant's) for that move, which keeps
// its request: a batch whose stage stopped before the move would hold
// every later decision. Past it, the decision goes before its request.
const requestWait = 10 * time.Second

// unmoved is the waitSeq of a decision that waits for its batch's move to
// awaiting, at a sequence not known yet.
const unmoved = ^uint64(0)

// maxPartitions bounds the turn-log partitions a cursor names.
const maxPartitions = topology.MaxTurnLogPartitions

// Event is one event as the feed hands it out.
type Event struct {
	// ID is the feed's position after this event: Options.After = ID
	// resumes after it. Its String is the SSE id.
	ID Cursor
	// Source is the stream it was read from (0: TOLLGATE_EVENTS; 1+i:
	// TOLLGATE_TURNLOG_<i>; the last, len(ID)-1: KV_tollgate_approvals),
	// Seq its sequence there.
	Source int
	Seq    uint64
	// Subject is a TOLLGATE_EVENTS subject: a turn's outcome read from
	// its log is tollgate.event.turn.outcome.<turn>, a request read from
	// its awaiting event tollgate.event.approval.requested.<turn>, a
	// decision read from the approvals bucket
	// tollgate.event.approval.decided.<turn>.
	Subject string
	// Data is the event's record (msgpack): for an outcome, the
	// TurnOutcome alone; for a request, its ApprovalRecord; for a
	// decision, its DecidedEvent.
	Data []byte

	skip     bool   // a message that stands for no event (a published copy a log keeps, a revision that decides nothing): advances the position only
	more     bool   // (request from a log) another of its awaiting event's requests follows: the position stays before that event
	part     int    // (request from a log) its place among its awaiting event's requests, from 1
	after    uint64 // (outcome from a log) the turn's last TOLLGATE_EVENTS sequence it waits for
	afterDec uint64 // (outcome from a log) the bucket sequence it waits for: its approvals' latest revisions
	// (an approval's decided or voted event) the source and sequence of
	// the message that keeps its request, which it waits for (waitSeq 0:
	// none): a partition's awaiting event, or for a decision from the
	// bucket whose request no log keeps, the turn's last published
	// request in TOLLGATE_EVENTS. For a decision from the bucket stored
	// before its batch moved to awaiting, waitSeq is unmoved and waitTurn
	// the turn: it waits for the next event of the turn the partition
	// hands out after waitFrom (the move, or the turn's end), at most
	// requestWait.
	waitSrc  int
	waitSeq  uint64
	waitTurn string
	waitFrom uint64
	turn     string // (from a log) the turn of its message
	id       string // (a decision from the bucket) its approval
	// (replayed) when its message was stored: the replay hands out, of
	// the streams' next events that may go, the earliest stored.
	at time.Time
	// (a published decided event without Repeat) the bucket sequence of
	// the revision that holds its decision (0: the bucket holds it no
	// more): a subscriber whose origin is before it gets the decision
	// from the bucket, not this copy.
	dup uint64
}

// source is one stream the feed follows.
type source struct {
	stream  jetstream.Stream
	filters []string
	cc      jetstream.ConsumeContext
}

// Feed hands the events of TOLLGATE_EVENTS, the turns' outcomes and
// requests from the turn logs and the approvals' decisions from their
// bucket to its subscribers. A process makes one and shares it between
// every surface that streams events.
type Feed struct {
	js  jetstream.JetStream
	log *slog.Logger

	mu     sync.Mutex
	gen    int       // bumped by every start: callbacks of an earlier one are ignored
	srcs   []*source // nil: not following yet (or closed); [0] events, [1+i] turn log i, [len-1] the approvals bucket
	last   Cursor    // per source, the last message handed out (or where the feed started)
	seen   Cursor    // per source, the last message received (held ones included)
	held   [][]Event // per partition, its events from a held outcome on (waiting for the events stream or the bucket), in order
	wait   []Event   // the events stream's, from a held decision or vote on (waiting for a partition), in order
	decs   []Event   // the bucket's, from a held decision on (waiting for a partition or the events stream), in order
	subs   map[*Sub]struct{}
	owners map[string]int // open streams by owner

	beforeMsg   func(subject string) // (tests) called with each message the feed follows, before it reads it
	requestWait time.Duration        // (tests) requestWait, when set
}

// New returns a Feed reading over js; it starts following the streams on
// its first subscriber. The turn-log streams and the approvals bucket
// must exist (topology.Ensure).
func New(js jetstream.JetStream, logger *slog.Logger) *Feed {
	return &Feed{js: js, log: logger, subs: map[*Sub]struct{}{}, owners: map[string]int{}}
}

// Options describe a subscription.
type Options struct {
	// Filters are the subjects (NATS wildcards allowed) the subscriber
	// wants, in TOLLGATE_EVENTS's namespace (a turn's outcome from its log
	// matches as tollgate.event.turn.outcome.<turn>, a request from its
	// log as tollgate.event.approval.requested.<turn>, a decision from the
	// approvals bucket as tollgate.event.approval.decided.<turn>); none
	// means every event.
	Filters []string
	// After: the subscriber gets the events handed out after this cursor
	// (an Event.ID, or ParseCursor of an SSE id); nil: from the first
	// message of every stream. A cursor of an earlier version is read as
	// cursor.go says: of one sequence (a TOLLGATE_EVENTS sequence), it
	// reads TOLLGATE_EVENTS after it, and the turn logs and the bucket
	// from the time it was stored; of every stream but the approvals
	// bucket, the bucket from that time. A cursor of another length than
	// those, or beyond a stream's last message, is refused with code
	// schemas.CodeInvalidInput.
	After Cursor
	// New, when set, ignores After: only events handed out from now on.
	New bool
	// Owner and Max cap the streams open at once: a subscription of an
	// owner that holds Max is refused ErrTooManyStreams. Max 0 is no cap.
	Owner string
	Max   int
	// Buffer is how many events the subscriber's buffer holds (default
	// Buffer).
	Buffer int
}

// Position is where each stream ends now (its last message), as a
// cursor: a page rendered after reading it opens its stream there and
// misses nothing stored after it.
func (f *Feed) Position(ctx context.Context) (Cursor, error) {
	f.mu.Lock()
	err := f.startLocked(ctx)
	srcs := f.srcs
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	c := make(Cursor, len(srcs))
	for i, s := range srcs {
		info, err := s.stream.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("eventfeed: stream info: %w", err)
		}
		c[i] = info.State.LastSeq
	}
	return c, nil
}

// Subscribe starts a subscription. Close it when done. It fails with
// ErrTooManyStreams, an INVALID_INPUT error for a bad or too-far After,
// or the bus's error when a stream cannot be read.
func (f *Feed) Subscribe(ctx context.Context, o Options) (*Sub, error) {
	filters := o.Filters
	if len(filters) == 0 {
		filters = []string{Subjects}
	}
	f.mu.Lock()
	if err := f.startLocked(ctx); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	if o.Max > 0 && f.owners[o.Owner] >= o.Max {
		f.mu.Unlock()
		return nil, ErrTooManyStreams
	}
	last, srcs := slices.Clone(f.last), f.srcs
	f.mu.Unlock()

	n := len(srcs)
	dec := n - 1
	from, sp, form := make(Cursor, n), split{}, formFull
	if !o.New && len(o.After) > 0 {
		var err error
		if from, sp, form, err = placeCursor(o.After, n); err != nil {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %s: %v", o.After, err)
		}
	}
	var since time.Time
	if !o.New {
		for i, s := range srcs {
			if from[i] <= last[i] {
				continue
			}
			// Ahead of this feed: another process may have handed it out a
			// moment ago; the stream says whether it exists.
			info, err := s.stream.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("eventfeed: stream info: %w", err)
			}
			if from[i] > info.State.LastSeq {
				return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %s is beyond the last message of %s (%d)", o.After, info.Config.Name, info.State.LastSeq)
			}
		}
		if form != formFull && from[0] > 0 {
			m, err := srcs[0].stream.GetMsg(ctx, from[0])
			switch {
			case err == nil:
				since = m.Time
			case !errors.Is(err, jetstream.ErrMsgNotFound): // gone: the logs and the bucket from their start
				return nil, fmt.Errorf("eventfeed: read event %d: %w", from[0], err)
			}
		}
		if form != formFull && !since.IsZero() && len(decFilters(filters)) > 0 {
			b, err := positionAt(ctx, srcs[dec].stream, topology.ApprovalRevisions, since)
			if err != nil {
				return nil, err
			}
			from[dec] = b
		}
	}
	bare := form == formBare

	s := &Sub{f: f, filters: filters, owner: o.Owner, ch: make(chan Event, cmp.Or(o.Buffer, Buffer)), done: make(chan struct{}), split: sp}
	f.mu.Lock()
	if f.srcs == nil || len(f.srcs) != n {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	if o.Max > 0 && f.owners[o.Owner] >= o.Max {
		f.mu.Unlock()
		return nil, ErrTooManyStreams
	}
	// From here every message the feed hands out, those after f.last,
	// goes to the buffer; the replay reads those up to f.last.
	s.until, s.after = slices.Clone(f.last), make(Cursor, n)
	for i := range n {
		s.after[i] = max(from[i], f.last[i])
		if o.New || (bare && i > 0 && i < dec) {
			s.after[i] = f.last[i]
		}
	}
	switch {
	case o.New:
		s.origin = f.last[dec]
	case form != formFull:
		s.origin = from[dec]
	}
	f.owners[o.Owner]++
	f.subs[s] = struct{}{}
	f.mu.Unlock()

	if !o.New {
		if err := s.startReplay(ctx, srcs, from, bare, since); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// positionAt is the position in stream (its messages on filter) at time
// t: the sequence before the first message stored after t, or the last
// message when none is. A consumer of its own reads it, deleted at once.
func positionAt(ctx context.Context, stream jetstream.Stream, filter string, t time.Time) (uint64, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("eventfeed: stream info: %w", err)
	}
	name := info.Config.Name
	start := t.Add(time.Nanosecond)
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Name:          "position-" + rand.Text(),
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
		AckPolicy:     jetstream.AckNonePolicy,
		FilterSubject: filter,
		MemoryStorage: true, Replicas: 1,
		InactiveThreshold: replayIdle,
	})
	if err != nil {
		return 0, fmt.Errorf("eventfeed: a consumer of %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name) // else the server drops it when idle
	}()
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return 0, fmt.Errorf("eventfeed: read %s: %w", name, err)
	}
	pos := info.State.LastSeq
	for m := range batch.Messages() {
		if meta, err := m.Metadata(); err == nil {
			pos = meta.Sequence.Stream - 1
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return 0, fmt.Errorf("eventfeed: read %s: %w", name, err)
	}
	return pos, nil
}

// startLocked follows the streams from their last messages, if not yet.
func (f *Feed) startLocked(ctx context.Context) error {
	if f.srcs != nil {
		return nil
	}
	events, err := f.js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return fmt.Errorf("eventfeed: stream %s: %w", topology.StreamEvents, err)
	}
	logs, err := topology.OpenTurnLogs(ctx, f.js)
	if err != nil {
		return fmt.Errorf("eventfeed: %w", err)
	}
	approvals, err := f.js.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		return fmt.Errorf("eventfeed: stream %s: %w", topology.StreamApprovals, err)
	}
	srcs := []*source{{stream: events, filters: []string{Subjects}}}
	for i, l := range logs {
		srcs = append(srcs, &source{stream: l, filters: []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i)}})
	}
	srcs = append(srcs, &source{stream: approvals, filters: []string{topology.ApprovalRevisions}})
	dec := len(srcs) - 1
	f.gen++
	gen := f.gen
	last := make(Cursor, len(srcs))
	stop := func() {
		for _, s := range srcs {
			if s.cc != nil {
				s.cc.Stop()
			}
		}
	}
	for i, s := range srcs {
		last[i] = s.stream.CachedInfo().State.LastSeq
		cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: s.filters,
			DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: last[i] + 1,
		})
		if err != nil {
			stop()
			return fmt.Errorf("eventfeed: consumer of %s: %w", s.stream.CachedInfo().Config.Name, err)
		}
		var hand func(jetstream.Msg)
		switch {
		case i == 0:
			hand = func(m jetstream.Msg) { f.handEvent(gen, m) }
		case i == dec:
			hand = func(m jetstream.Msg) { f.handDecision(gen, dec, m) }
		default:
			hand = func(m jetstream.Msg) { f.handLog(gen, i-1, m) }
		}
		s.cc, err = cons.Consume(hand, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			f.log.Warn("eventfeed: following a stream", "stream", s.stream.CachedInfo().Config.Name, "err", err)
		}))
		if err != nil {
			stop()
			return fmt.Errorf("eventfeed: consume %s: %w", s.stream.CachedInfo().Config.Name, err)
		}
	}
	f.srcs, f.last, f.seen, f.held, f.wait, f.decs = srcs, last, slices.Clone(last), make([][]Event, len(logs)), nil, nil
	return nil
}

// handEvent takes a TOLLGATE_EVENTS message (presentEvent): it waits
// behind the events stream's held ones, then is handed to the subscribers
// that want it. The ordered consumer calls it once per message, in order.
func (f *Feed) handEvent(gen int, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	if f.beforeMsg != nil {
		f.beforeMsg(m.Subject())
	}
	ev := f.presentEvent(meta.Sequence.Stream, m.Subject(), m.Data())
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen || ev.Seq <= f.seen[0] {
		return
	}
	f.seen[0] = ev.Seq
	f.wait = append(f.wait, ev)
	f.releaseLocked()
}

// presentEvent is the event a TOLLGATE_EVENTS message stands for: passed
// over (skip) when it is a published outcome or request that its turn's
// log keeps (the log's is handed out); an approval's decided or voted
// event whose request a log keeps waits for that awaiting event; a
// decided event without Repeat carries the bucket revision of its
// decision (dup); any other is handed out as it is.
func (f *Feed) presentEvent(seq uint64, subject string, data []byte) Event {
	ev := Event{Seq: seq, Subject: subject, Data: data}
	if turn, ok := strings.CutPrefix(subject, topology.SubjectTurnOutcome); ok {
		ev.skip = f.logHolds(turn)
		return ev
	}
	a, ok := approvalOf(subject, data)
	if !ok {
		return ev
	}
	if a.copy {
		ev.dup = f.decisionSeq(a.id)
	}
	p, at, kept := f.loggedRequest(a.turn, a.id)
	switch {
	case !kept:
	case a.requested:
		ev.skip = true
	default:
		ev.waitSrc, ev.waitSeq = 1+p, at
	}
	return ev
}

// approval is what approvalOf reads of an approval's event.
type approval struct {
	turn, id  string
	requested bool // an approval.requested event
	copy      bool // an approval.decided event without Repeat: a copy of a revision of the bucket
}

// approvalOf reads the turn and approval of an approval's requested,
// decided or voted event; false for any other event, or one that does
// not decode (handed out as it is).
func approvalOf(subject string, data []byte) (approval, bool) {
	var prefix string
	for _, p := range []string{topology.SubjectApprovalRequested, topology.SubjectApprovalDecided, topology.SubjectApprovalVoted} {
		if strings.HasPrefix(subject, p) {
			prefix = p
		}
	}
	if prefix == "" {
		return approval{}, false
	}
	_, rec, err := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided, topology.RouteApprovalVoted)
	if err != nil {
		return approval{}, false
	}
	a := approval{turn: strings.TrimPrefix(subject, prefix), requested: prefix == topology.SubjectApprovalRequested}
	switch r := rec.(type) {
	case *schemas.ApprovalRecord:
		a.id = r.ApprovalID
	case *schemas.DecidedEvent:
		a.id, a.copy = r.ApprovalID, r.Repeat == ""
	case *schemas.VotedEvent:
		a.id = r.ApprovalID
	}
	return a, a.id != ""
}

// handLog takes an event of turn-log partition p (presentLog): it waits
// behind the partition's held ones, then is handed to the subscribers
// that want it. The ordered consumer calls it once per message, in order.
func (f *Feed) handLog(gen, p int, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	if f.beforeMsg != nil {
		f.beforeMsg(m.Subject())
	}
	evs := f.presentLog(p, meta.Sequence.Stream, m.Subject(), m.Data())
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen || meta.Sequence.Stream <= f.seen[1+p] {
		return
	}
	f.seen[1+p] = meta.Sequence.Stream
	f.held[p] = append(f.held[p], evs...)
	f.releaseLocked()
}

// presentLog is what a message of turn-log partition p stands for: an
// outcome event, its turn's outcome event (presentOutcome); an awaiting
// event, one approval-requested event per request it keeps, in its order
// (presentRequests); any other message, or one that holds neither, is
// passed over (one skip).
func (f *Feed) presentLog(p int, seq uint64, subject string, data []byte) []Event {
	_, turn, event, ok := topology.ParseTurnLogSubject(subject)
	evs := []Event{{Source: 1 + p, Seq: seq, skip: true}}
	switch {
	case ok && event == store.EventOutcome:
		evs = []Event{f.presentOutcome(p, seq, turn, subject, data)}
	case ok && event == store.EventAwaiting:
		if reqs := f.presentRequests(p, seq, turn, subject, data); len(reqs) > 0 {
			evs = reqs
		}
	}
	for i := range evs {
		evs[i].turn = turn
	}
	return evs
}

// presentOutcome is the event a turn log's outcome message stands for:
// the turn's outcome event (the outcome read as store.DecodeOutcome
// reads it), waiting for the turn's last event in TOLLGATE_EVENTS and
// its approvals' latest revisions in the bucket; a message that holds no
// outcome is passed over (skip), with a warning.
func (f *Feed) presentOutcome(p int, seq uint64, turn, subject string, data []byte) Event {
	ev := Event{Source: 1 + p, Seq: seq, skip: true}
	b, err := schemas.DecodeBatch(data)
	switch {
	case err != nil:
	case b.TurnID != turn:
		err = schemas.Errorf(schemas.CodeInvalidInput, "the outcome event of turn %s holds turn %s's batch", turn, b.TurnID)
	case b.Outcome == nil:
		return ev // its published outcome is handed out (logHolds)
	default:
		ev.Data, err = schemas.Encode(b.Outcome)
	}
	if err != nil {
		f.log.Warn("eventfeed: an outcome event that holds no outcome is passed over", "subject", subject, "seq", seq, "err", err)
		return ev
	}
	ev.Subject, ev.skip = topology.EventSubject(topology.SubjectTurnOutcome, turn), false
	ev.after = f.lastEventOf(turn)
	ev.afterDec = f.lastRevisionOf(b)
	return ev
}

// presentRequests are the events a turn log's awaiting message stands
// for: one approval-requested event of the turn per request it keeps, in
// its order, each but the last marked more. None when it keeps none (its
// requests, if any, were published); one that does not decode keeps none,
// with a warning.
func (f *Feed) presentRequests(p int, seq uint64, turn, subject string, data []byte) []Event {
	reqs, err := store.DecodeRequested(turn, data)
	if err != nil {
		f.log.Warn("eventfeed: an awaiting event that does not decode is passed over", "subject", subject, "seq", seq, "err", err)
		return nil
	}
	var out []Event
	for _, r := range reqs {
		b, err := schemas.Encode(r)
		if err != nil {
			f.log.Warn("eventfeed: a request of an awaiting event is passed over", "subject", subject, "seq", seq, "approval", r.ApprovalID, "err", err)
			continue
		}
		out = append(out, Event{Source: 1 + p, Seq: seq, Subject: topology.EventSubject(topology.SubjectApprovalRequested, turn), Data: b, more: true, part: len(out) + 1})
	}
	if len(out) > 0 {
		out[len(out)-1].more = false
	}
	return out
}

// handDecision takes a message of the approvals bucket, source dec
// (presentDecision): it waits behind the bucket's held ones, then is
// handed to the subscribers that want it. The ordered consumer calls it
// once per message, in order.
func (f *Feed) handDecision(gen, dec int, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	if f.beforeMsg != nil {
		f.beforeMsg(m.Subject())
	}
	ev := f.presentDecision(dec, meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen || ev.Seq <= f.seen[dec] {
		return
	}
	f.seen[dec] = ev.Seq
	f.decs = append(f.decs, ev)
	f.releaseLocked()
	if ev.waitSeq != unmoved {
		return
	}
	// Held for its batch's move to awaiting: the partition may have handed
	// the move out since it was looked up (from now on, handLogLocked sees
	// it), so look again; and stop waiting after requestWait.
	time.AfterFunc(cmp.Or(f.requestWait, requestWait), func() { f.stopWaiting(gen, ev.Seq) })
	f.mu.Unlock()
	again := ev
	f.waitForRequest(&again, ev.waitTurn)
	f.mu.Lock()
	if gen != f.gen || again.waitSeq == unmoved {
		return
	}
	for i, d := range f.decs {
		if d.Seq == ev.Seq && d.waitSeq == unmoved {
			f.decs[i].waitSrc, f.decs[i].waitSeq, f.decs[i].waitTurn = again.waitSrc, again.waitSeq, ""
			f.releaseLocked()
			return
		}
	}
}

// stopWaiting lets the bucket's held decision at seq go, if it still
// waits for its batch's move to awaiting (requestWait).
func (f *Feed) stopWaiting(gen int, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen {
		return
	}
	for i, d := range f.decs {
		if d.Seq == seq && d.waitSeq == unmoved {
			f.log.Warn("eventfeed: a decision's batch did not move to awaiting in time: the decision goes before its request", "subject", d.Subject, "seq", d.Seq, "turn", d.waitTurn)
			f.decs[i].waitSeq, f.decs[i].waitTurn = 0, ""
			f.releaseLocked()
			return
		}
	}
}

// presentDecision is the event a message of the approvals bucket (source
// src) stands for: a decision (store.DecidedOf) is its approval.decided
// event, waiting for its request (the awaiting event that keeps it; the
// turn's move to awaiting, when its batch has not moved yet; or the
// turn's last published request); any other revision is passed over
// (skip), one that does not decode with a warning.
func (f *Feed) presentDecision(src int, seq uint64, subject string, h nats.Header, data []byte) Event {
	ev := Event{Source: src, Seq: seq, skip: true}
	d, err := store.DecidedOf(subject, h, data)
	if err == nil && d != nil && !schemas.ValidKey(d.TurnID) {
		err = schemas.Errorf(schemas.CodeMalformed, "approval %s names turn %q", d.ApprovalID, d.TurnID)
	}
	var b []byte
	if err == nil && d != nil {
		b, err = schemas.Encode(d)
	}
	switch {
	case schemas.CodeOf(err) == schemas.CodeSchemaVersionUnsupported:
		// A version 1 record (an earlier version's): its decision's
		// published copy is handed out (decisionSeq).
		f.log.Debug("eventfeed: an approval's revision of an earlier version is passed over", "subject", subject, "seq", seq, "err", err)
		return ev
	case err != nil:
		f.log.Warn("eventfeed: an approval's revision that does not decode is passed over", "subject", subject, "seq", seq, "err", err)
		return ev
	case d == nil:
		return ev
	}
	ev.Subject, ev.Data, ev.skip = topology.EventSubject(topology.SubjectApprovalDecided, d.TurnID), b, false
	ev.id = d.ApprovalID
	f.waitForRequest(&ev, d.TurnID)
	return ev
}

// waitForRequest sets what ev, a decision of turn's approval ev.id from
// the bucket, waits for: the awaiting event that keeps its request; when
// its batch has not moved to awaiting yet, that move; else the turn's
// last published request.
func (f *Feed) waitForRequest(ev *Event, turn string) {
	if p, at, kept := f.loggedRequest(turn, ev.id); kept {
		ev.waitSrc, ev.waitSeq, ev.waitTurn = 1+p, at, ""
	} else if p, last, ok := f.unmovedBatch(turn); ok {
		ev.waitSrc, ev.waitSeq, ev.waitTurn, ev.waitFrom = 1+p, unmoved, turn, last
	} else {
		ev.waitSrc, ev.waitSeq, ev.waitTurn = 0, f.lastRequestOf(turn), ""
	}
}

// releaseLocked hands out, in each stream's order, the held events that
// may go: TOLLGATE_EVENTS's and the bucket's once the one at their head
// finds the feed past the message keeping its request; each partition's
// once the outcome at its head finds the feed past its turn's events and
// decisions. When the heads wait for each other round a circle, none
// could ever go: an outcome on it goes first (package doc).
func (f *Feed) releaseLocked() {
	dec := len(f.srcs) - 1
	for {
		moved := false
		for _, q := range []*[]Event{&f.wait, &f.decs} {
			for len(*q) > 0 && reached(f.last, (*q)[0]) {
				ev := (*q)[0]
				*q = (*q)[1:]
				f.last[ev.Source] = ev.Seq
				if !ev.skip {
					f.handLocked(ev)
				}
				moved = true
			}
		}
		for p, q := range f.held {
			for len(q) > 0 && q[0].after <= f.last[0] && q[0].afterDec <= f.last[dec] {
				f.handLogLocked(q[0])
				q, moved = q[1:], true
			}
			f.held[p] = q
		}
		if moved {
			continue
		}
		i, ok := onCycle(len(f.srcs), f.waitsLocked)
		if !ok {
			return
		}
		p := i - 1
		f.log.Debug("eventfeed: held events wait for each other: an outcome goes first", "stream", topology.TurnLogStream(p), "seq", f.held[p][0].Seq)
		f.handLogLocked(f.held[p][0])
		f.held[p] = f.held[p][1:]
	}
}

// reached reports whether ev, at the head of TOLLGATE_EVENTS's or the
// bucket's held events, may go at position pos: it waits for nothing, or
// pos is past the message it waits for.
func reached(pos Cursor, ev Event) bool {
	return ev.waitSeq == 0 || ev.waitSeq <= pos[ev.waitSrc]
}

// waitsLocked are the sources whose held head the held head of source i
// waits for (none when i holds nothing, or waits only for messages the
// feed has not received yet).
func (f *Feed) waitsLocked(i int) []int {
	dec := len(f.srcs) - 1
	var q []Event
	switch {
	case i == 0:
		q = f.wait
	case i == dec:
		q = f.decs
	default:
		q = f.held[i-1]
	}
	if len(q) == 0 {
		return nil
	}
	held := func(j int) bool {
		switch {
		case j == 0:
			return len(f.wait) > 0
		case j == dec:
			return len(f.decs) > 0
		}
		return len(f.held[j-1]) > 0
	}
	ev := q[0]
	return headWaits(i, dec, ev, reached(f.last, ev) || !held(ev.waitSrc), func(j int, seq uint64) bool {
		return seq > f.last[j] && held(j)
	})
}

// headWaits is the one rule of which sources the head ev of source i
// waits for (dec: the bucket's source), live (waitsLocked) and in
// catch-up (Sub.waitsFor): an event of TOLLGATE_EVENTS or the bucket for
// the source of the message that keeps its request, unless done; a turn
// log's outcome for TOLLGATE_EVENTS and the bucket, each up to its seq,
// where need says it is not yet there.
func headWaits(i, dec int, ev Event, done bool, need func(j int, seq uint64) bool) []int {
	var out []int
	switch {
	case i == 0 || i == dec:
		if !done {
			out = append(out, ev.waitSrc)
		}
	default:
		if need(0, ev.after) {
			out = append(out, 0)
		}
		if need(dec, ev.afterDec) {
			out = append(out, dec)
		}
	}
	return out
}

// onCycle finds a turn-log partition's source (1 ≤ i < n-1) on a circle
// of waits among n sources, waits(i) being the sources the head of i
// waits for; false when there is none. Every circle has one: the events
// stream's and the bucket's heads wait only for partitions' messages or
// the events stream's, a partition's (an outcome) only for the events
// stream's and the bucket's, so a circle through the events stream and
// the bucket alone would have the events stream wait for the bucket.
func onCycle(n int, waits func(int) []int) (int, bool) {
	const (
		unseen = iota
		open
		closed
	)
	state := make([]int, n)
	var path []int
	var visit func(i int) (int, bool)
	visit = func(i int) (int, bool) {
		state[i] = open
		path = append(path, i)
		for _, j := range waits(i) {
			switch state[j] {
			case open:
				for _, c := range path[slices.Index(path, j):] {
					if c > 0 && c < n-1 {
						return c, true
					}
				}
			case unseen:
				if c, ok := visit(j); ok {
					return c, true
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = closed
		return 0, false
	}
	for i := range n {
		if state[i] == unseen {
			if c, ok := visit(i); ok {
				return c, true
			}
		}
	}
	return 0, false
}

// handLogLocked hands out ev, a turn log's event: the position moves to
// its message once the last event it stands for is out. A held decision
// that waits for its turn's move to awaiting waits for this message, the
// turn's first since (the partition's consumer follows only the moves to
// awaiting and the ends).
func (f *Feed) handLogLocked(ev Event) {
	if !ev.more {
		f.last[ev.Source] = ev.Seq
	}
	if !ev.skip {
		f.handLocked(ev)
	}
	for i, d := range f.decs {
		if d.waitSeq == unmoved && d.waitSrc == ev.Source && d.waitTurn == ev.turn && ev.Seq > d.waitFrom {
			f.decs[i].waitSeq, f.decs[i].waitTurn = ev.Seq, "" // the move (or the turn's end) is out
		}
	}
}

// handLocked gives ev to each subscriber that wants it; one whose buffer
// is full is cut off. f.last already counts ev.
func (f *Feed) handLocked(ev Event) {
	ev.ID = slices.Clone(f.last)
	if ev.more {
		ev.ID[ev.Source] = splitAt(ev.Seq, ev.part)
	}
	for s := range f.subs {
		if ev.Seq <= s.after[ev.Source] || s.split.covers(ev) || ev.dup > s.origin || !s.wants(ev.Subject) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			s.cutLocked(ErrSlow)
		}
	}
}

// streams are the feed's sources (nil before it starts).
func (f *Feed) streams() []*source {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.srcs
}

// logs are the turn-log streams the feed follows (none before it starts).
func (f *Feed) logs() []jetstream.Stream {
	srcs := f.streams()
	if len(srcs) < 3 {
		return nil
	}
	logs := make([]jetstream.Stream, len(srcs)-2)
	for i, s := range srcs[1 : len(srcs)-1] {
		logs[i] = s.stream
	}
	return logs
}

// logHolds reports whether turn's log holds its outcome event with the
// outcome (store.LoggedOutcome), so that a published copy of it is passed
// over. Should the log not be read, the copy is handed out (a repeat
// rather than a loss), with a warning.
func (f *Feed) logHolds(turn string) bool {
	logs := f.logs()
	if len(logs) == 0 || !schemas.ValidKey(turn) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	_, ok, err := store.LoggedOutcome(ctx, logs, turn)
	if err != nil {
		f.log.Warn("eventfeed: the turn's log could not be read: its published outcome is handed out", "turn", turn, "err", err)
	}
	return ok
}

// loggedRequest reports whether turn's log keeps the request of approval
// id, in which partition and at which sequence (store.LoggedRequest: the
// awaiting event that moved its batch to awaiting). Should the log not
// be read, false (a published copy is handed out, a decision is not
// held for the log), with a warning.
func (f *Feed) loggedRequest(turn, id string) (p int, seq uint64, ok bool) {
	logs := f.logs()
	if len(logs) == 0 || !schemas.ValidKey(turn) {
		return 0, 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	p = topology.TurnLogPartition(turn, len(logs))
	seq, ok, err := store.LoggedRequest(ctx, logs, turn, id)
	if err != nil {
		f.log.Warn("eventfeed: the turn's log could not be read: its request is taken as not kept there", "turn", turn, "approval", id, "err", err)
		return p, 0, false
	}
	return p, seq, ok
}

// unmovedBatch reports whether turn's batch is in its log and has not
// moved to awaiting yet (its last event is queued or running): a decision
// stored now (a standing grant's, written decided as its approval is
// created) has its request kept by that move, in partition p after the
// sequence last. Should the log not be read, false, with a warning.
func (f *Feed) unmovedBatch(turn string) (p int, last uint64, ok bool) {
	logs := f.logs()
	if len(logs) == 0 || !schemas.ValidKey(turn) {
		return 0, 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	p = topology.TurnLogPartition(turn, len(logs))
	m, err := logs[p].GetLastMsgForSubject(ctx, topology.TurnLogWildcard(p, turn))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return p, 0, false
	case err != nil:
		f.log.Warn("eventfeed: the turn's log could not be read: its decision is not held for its request", "turn", turn, "err", err)
		return p, 0, false
	}
	_, _, event, _ := topology.ParseTurnLogSubject(m.Subject)
	return p, m.Sequence, event == string(schemas.BatchQueued) || event == string(schemas.BatchRunning)
}

// lastEventOf is the sequence of turn's last event in TOLLGATE_EVENTS (0:
// none). Should it not be read, 0 (the outcome is not held), with a
// warning.
func (f *Feed) lastEventOf(turn string) uint64 {
	return f.lastOn(0, turnEvents(turn), turn, "the turn's last event could not be read: its outcome is not held for it")
}

// lastRequestOf is the sequence of turn's last published request in
// TOLLGATE_EVENTS (0: none). Should it not be read, 0 (the decision is
// not held), with a warning.
func (f *Feed) lastRequestOf(turn string) uint64 {
	return f.lastOn(0, topology.EventSubject(topology.SubjectApprovalRequested, turn), turn, "the turn's published requests could not be read: its decision is not held for them")
}

// lastOn is the sequence of the last message on subject (of turn) in the
// feed's source i, 0 when there is none; should it not be read, 0, with
// the warning why.
func (f *Feed) lastOn(i int, subject, turn, why string) uint64 {
	srcs := f.streams()
	if len(srcs) == 0 || !schemas.ValidKey(turn) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	m, err := srcs[i].stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case err == nil:
		return m.Sequence
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		f.log.Warn("eventfeed: "+why, "turn", turn, "subject", subject, "err", err)
	}
	return 0
}

// lastRevisionOf is the latest bucket sequence among the revisions of
// the approvals that batch b (an outcome event's) lists, and for a failed
// batch also of those it may have created unrecorded (whose ids the
// failure abandons: schemas.ApprovalID of each call without one); 0 for
// none. One that is not read counts as none, with a warning (the outcome
// is not held for it).
func (f *Feed) lastRevisionOf(b *schemas.BatchRecord) uint64 {
	srcs := f.streams()
	if len(srcs) == 0 {
		return 0
	}
	bucket := srcs[len(srcs)-1].stream
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	var last uint64
	for i, id := range b.Approvals {
		if id == "" && b.State == schemas.BatchFailed {
			id = schemas.ApprovalID(b.TurnID, i)
		}
		if !schemas.ValidKey(id) {
			continue
		}
		m, err := bucket.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
		switch {
		case err == nil:
			last = max(last, m.Sequence)
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			f.log.Warn("eventfeed: an approval's revision could not be read: its turn's outcome is not held for it", "turn", b.TurnID, "approval", id, "err", err)
		}
	}
	return last
}

// decisionSeq is the bucket sequence of the revision that holds approval
// id's decision (store.DecidedOf); 0 when its latest revision is no
// decision (a rewrite, a delete, an earlier version's record) or there is
// none. Should it not be read, 0 (its published copy is handed out: a
// repeat rather than a loss), with a warning.
func (f *Feed) decisionSeq(id string) uint64 {
	srcs := f.streams()
	if len(srcs) == 0 || !schemas.ValidKey(id) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	m, err := srcs[len(srcs)-1].stream.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0
	case err != nil:
		f.log.Warn("eventfeed: an approval's revision could not be read: its published decision is handed out", "approval", id, "err", err)
		return 0
	}
	if d, err := store.DecidedOf(m.Subject, m.Header, m.Data); err != nil || d == nil {
		return 0
	}
	return m.Sequence
}

// turnEvents is the subject of every event of turn in TOLLGATE_EVENTS
// (docs/protocol.md §5: the turn id is the last of five tokens).
func turnEvents(turn string) string { return "tollgate.event.*.*." + turn }

// Close stops following the streams and cuts every subscriber off with
// ErrClosed. A later Subscribe starts the feed again.
func (f *Feed) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.srcs {
		s.cc.Stop()
	}
	f.srcs, f.held, f.wait, f.decs = nil, nil, nil, nil
	f.gen++
	for s := range f.subs {
		s.cutLocked(ErrClosed)
	}
}

// Open is how many streams owner holds open.
func (f *Feed) Open(owner string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owners[owner]
}

// Sub is one subscription: Next reads its events. Next and Close are
// called from one goroutine.
type Sub struct {
	f       *Feed
	filters []string
	owner   string
	after   Cursor // per source, the feed hands over only messages after this one
	split   split  // and, of the message right after its partition's, not the requests a split position says it had
	origin  uint64 // and no published decided copy of a revision after this one of the bucket (package doc)
	ch      chan Event
	done    chan struct{} // closed when cut off; err says why
	err     error
	closed  bool

	// The replay of the events missed, up to until, read before ch.
	replay []*replaySource // nil: caught up
	cur    Cursor          // the position after the last replayed event
	until  Cursor
	group  *replaySource // the replay whose awaiting event's requests are being handed out
}

// replaySource reads one stream's missed messages.
type replaySource struct {
	i      int
	stream jetstream.Stream
	cons   jetstream.Consumer
	buf    []Event // read, not yet taken
	done   bool    // nothing more up to until
}

// Next returns the subscription's next event: those missed first, then
// the feed's. It waits until there is one, ctx ends (ctx's error) or the
// subscriber is cut off (ErrSlow, ErrClosed).
func (s *Sub) Next(ctx context.Context) (Event, error) {
	for s.replay != nil {
		ev, ok, err := s.nextReplayed(ctx)
		if err != nil {
			return Event{}, err
		}
		if ok {
			return ev, nil
		}
	}
	select {
	case ev := <-s.ch:
		return ev, nil
	case <-s.done:
		return Event{}, s.err
	case <-ctx.Done():
		return Event{}, ctx.Err()
	}
}

// Close ends the subscription and frees its owner's slot.
func (s *Sub) Close() {
	s.f.mu.Lock()
	if !s.closed {
		s.closed = true
		delete(s.f.subs, s)
		if s.f.owners[s.owner]--; s.f.owners[s.owner] <= 0 {
			delete(s.f.owners, s.owner)
		}
	}
	s.f.mu.Unlock()
	s.endReplay()
}

// cutLocked stops handing events to s; Next answers err once its buffer
// is read. The caller holds the feed's lock.
func (s *Sub) cutLocked(err error) {
	if _, ok := s.f.subs[s]; !ok {
		return
	}
	delete(s.f.subs, s)
	s.err = err
	close(s.done)
}

func (s *Sub) wants(subject string) bool {
	for _, f := range s.filters {
		if Match(f, subject) {
			return true
		}
	}
	return false
}

// startReplay makes the consumers that read the messages after from up
// to s.until, on each stream that holds some the subscriber wants; for a
// bare cursor, the turn logs' from since (zero: their start).
func (s *Sub) startReplay(ctx context.Context, srcs []*source, from Cursor, bare bool, since time.Time) error {
	s.cur = slices.Clone(from)
	dec := len(srcs) - 1
	logs := logFilters(s.filters, len(srcs)-2)
	for i, src := range srcs {
		var filters []string
		switch {
		case i == 0:
			filters = s.filters
		case i == dec:
			filters = decFilters(s.filters)
		default:
			filters = logs[i-1]
		}
		byTime := bare && i > 0 && i < dec
		if len(filters) == 0 || (!byTime && from[i] >= s.until[i]) || s.until[i] == 0 {
			s.cur[i] = max(s.cur[i], s.until[i]) // nothing it wants in between
			continue
		}
		cfg := jetstream.ConsumerConfig{
			Name:          "replay-" + rand.Text(),
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckNonePolicy,
			MemoryStorage: true, Replicas: 1,
			InactiveThreshold: replayIdle,
		}
		switch {
		case byTime && !since.IsZero():
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
		case !byTime && from[i] > 0:
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from[i]+1
		}
		if len(filters) == 1 {
			cfg.FilterSubject = filters[0]
		} else {
			cfg.FilterSubjects = filters
		}
		cons, err := src.stream.CreateConsumer(ctx, cfg)
		if err != nil {
			return fmt.Errorf("eventfeed: replay consumer: %w", err)
		}
		r := &replaySource{i: i, stream: src.stream, cons: cons}
		s.replay = append(s.replay, r)
		if byTime {
			// The position before its first message: read it now.
			s.cur[i] = s.until[i]
			if err := s.fill(ctx, r); err != nil {
				return err
			}
			if len(r.buf) > 0 {
				s.cur[i] = r.buf[0].Seq - 1
			}
		}
	}
	if len(s.replay) == 0 {
		s.replay = nil
	}
	return nil
}

// fill reads r's next batch of missed messages, up to s.until, into its
// buffer; r is done when there are no more.
func (s *Sub) fill(ctx context.Context, r *replaySource) error {
	batch, err := r.cons.FetchNoWait(replayBatch)
	if err != nil {
		return fmt.Errorf("eventfeed: replay: %w", err)
	}
	dec := len(s.cur) - 1
	n := 0
	for m := range batch.Messages() {
		n++
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		seq := meta.Sequence.Stream
		var evs []Event
		switch {
		case seq > s.until[r.i]:
			r.done = true // the feed hands this one and the later ones over
		case r.i == 0:
			evs = []Event{s.f.presentEvent(seq, m.Subject(), m.Data())}
		case r.i == dec:
			evs = []Event{s.f.presentDecision(dec, seq, m.Subject(), m.Headers(), m.Data())}
		default:
			evs = s.f.presentLog(r.i-1, seq, m.Subject(), m.Data())
		}
		for i := range evs {
			evs[i].at = meta.Timestamp
		}
		r.buf = append(r.buf, evs...)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return fmt.Errorf("eventfeed: replay: %w", err)
	}
	if n == 0 {
		r.done = true
	}
	return ctx.Err()
}

// nextReplayed takes the next missed event, by the feed's rules: the
// rest of an awaiting event's requests once one is out; else, of the
// streams' next events that may go (waitsFor: an outcome once the replay
// has passed its turn's last event and its approvals' latest revisions,
// while there are more of those streams to replay; an event of
// TOLLGATE_EVENTS or the bucket once it has passed the message keeping
// its request), the earliest stored, so that events of different streams
// come in the order they happened where the rules leave it open; else,
// the heads waiting for each other round a circle, an outcome on it.
// false: nothing to hand out this time (a passed-over message, or the
// replay just ended).
func (s *Sub) nextReplayed(ctx context.Context) (Event, bool, error) {
	for _, r := range s.replay {
		if len(r.buf) == 0 && !r.done {
			if err := s.fill(ctx, r); err != nil {
				s.endReplay()
				return Event{}, false, err
			}
		}
	}
	pick := s.group
	if pick != nil && len(pick.buf) == 0 {
		pick = nil // (cannot be: an event's requests are read at once)
	}
	if pick == nil {
		for _, r := range s.replay {
			if len(r.buf) > 0 && s.waitsFor(r) == nil && (pick == nil || r.buf[0].at.Before(pick.buf[0].at)) {
				pick = r
			}
		}
	}
	if pick == nil {
		if i, ok := onCycle(len(s.cur), func(i int) []int {
			if r := s.replayOf(i); r != nil {
				return s.waitsFor(r)
			}
			return nil
		}); ok {
			pick = s.replayOf(i)
		}
	}
	if pick == nil {
		for _, r := range s.replay {
			if len(r.buf) > 0 || !r.done {
				return Event{}, false, nil // more to read
			}
		}
		s.endReplay()
		return Event{}, false, nil
	}
	ev := pick.buf[0]
	pick.buf = pick.buf[1:]
	ev.Source = pick.i
	s.group = nil
	if ev.more {
		s.group = pick
	} else {
		s.cur[pick.i] = ev.Seq
	}
	if ev.skip || s.split.covers(ev) || ev.dup > s.origin {
		return Event{}, false, nil
	}
	ev.ID = slices.Clone(s.cur)
	if ev.more {
		ev.ID[pick.i] = splitAt(ev.Seq, ev.part)
	}
	return ev, true, nil
}

// waitsFor are the replayed streams that r's next event waits for, each
// with more to replay (none: it may go): a turn log's outcome waits for
// TOLLGATE_EVENTS up to its turn's last event and for the bucket up to
// its approvals' latest revisions; an event of TOLLGATE_EVENTS or the
// bucket for the stream of the message that keeps its request, up to it.
func (s *Sub) waitsFor(r *replaySource) []int {
	if len(r.buf) == 0 {
		return nil
	}
	dec := len(s.cur) - 1
	ev := r.buf[0]
	left := func(i int) bool {
		q := s.replayOf(i)
		return q != nil && len(q.buf) > 0
	}
	return headWaits(r.i, dec, ev, s.passed(ev.waitSrc, ev.waitSeq), func(j int, seq uint64) bool {
		return seq > s.cur[j] && left(j)
	})
}

// passed reports whether the replay has handed out source i up to its
// message seq (0: none), or never will: it reads nothing of i at or
// before seq up to s.until (the feed hands out what comes after).
func (s *Sub) passed(i int, seq uint64) bool {
	if seq == 0 || s.cur[i] >= seq || seq > s.until[i] {
		return true
	}
	r := s.replayOf(i)
	return r == nil || (len(r.buf) > 0 && r.buf[0].Seq > seq) || (len(r.buf) == 0 && r.done)
}

// replayOf is the replay of source i (nil: it reads none).
func (s *Sub) replayOf(i int) *replaySource {
	for _, r := range s.replay {
		if r.i == i {
			return r
		}
	}
	return nil
}

// endReplay deletes the replay's consumers, if any.
func (s *Sub) endReplay() {
	rs := s.replay
	s.replay, s.group = nil, nil
	for _, r := range rs {
		name := r.cons.CachedInfo().Name
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := r.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			s.f.log.Warn("eventfeed: delete a replay consumer (the server drops it when idle)", "consumer", name, "err", err)
		}
		cancel()
	}
}

// logEvents are the turn-log events the feed hands out as
// TOLLGATE_EVENTS's: each's name, the subject prefix (before the turn id)
// it is handed out as, and the filter of a partition's.
var logEvents = []struct {
	name, prefix string
	all          func(partition int) string
}{
	{store.EventOutcome, topology.SubjectTurnOutcome, topology.TurnLogOutcomeFilter},
	{store.EventAwaiting, topology.SubjectApprovalRequested, topology.TurnLogAwaitingFilter},
}

// logFilters are, for each of parts partitions, the subjects of its
// events that filters want (none: the partition is not read): its outcome
// events for a filter that matches turns' outcome events, its awaiting
// events for one that matches their approval-requested events; each
// partition's for a filter that matches every turn's, the turn's in its
// partition for one that names a turn.
func logFilters(filters []string, parts int) [][]string {
	out := make([][]string, parts)
	for _, e := range logEvents {
		all, turns := false, make([][]string, parts)
		for _, f := range filters {
			turn, ok := filterTurn(f, e.prefix)
			switch {
			case !ok:
			case turn == "*":
				all = true
			default:
				p := topology.TurnLogPartition(turn, parts)
				if s := topology.TurnLogSubject(p, turn, e.name); !slices.Contains(turns[p], s) {
					turns[p] = append(turns[p], s)
				}
			}
		}
		for p := range parts {
			if all {
				out[p] = append(out[p], e.all(p))
			} else {
				out[p] = append(out[p], turns[p]...)
			}
		}
	}
	return out
}

// decFilters are the subjects of the approvals bucket's revisions that
// filters want (none: the bucket is not read): every approval's for a
// filter that matches every turn's approval-decided events; for one that
// names a turn, each approval id the turn can have (schemas.ApprovalID
// of each of schemas.MaxCalls calls: an approval id is one token, which
// no wildcard of the turn's can name).
func decFilters(filters []string) []string {
	var out []string
	for _, f := range filters {
		turn, ok := filterTurn(f, topology.SubjectApprovalDecided)
		switch {
		case !ok:
		case turn == "*":
			return []string{topology.ApprovalRevisions}
		default:
			for i := range schemas.MaxCalls {
				if s := topology.ApprovalRevisionSubject(schemas.ApprovalID(turn, i)); !slices.Contains(out, s) {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// filterTurn says whether filter matches subjects prefix+<turn> (a prefix
// of TOLLGATE_EVENTS's whose last token is a turn id), and for which
// turn: "*" for every turn.
func filterTurn(filter, prefix string) (string, bool) {
	want := strings.Split(prefix+"*", ".")
	toks := strings.Split(filter, ".")
	for i, tok := range toks {
		switch {
		case tok == ">":
			return "*", true
		case i >= len(want):
			return "", false
		case i == len(want)-1:
			return tok, i == len(toks)-1 && (tok == "*" || schemas.ValidKey(tok))
		case tok != "*" && tok != want[i]:
			return "", false
		}
	}
	return "", false
}

// Match reports whether subject matches filter, a NATS subject with
// wildcards ('*' one token, '>' the rest).
func Match(filter, subject string) bool {
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">":
			return st != ""
		case ft != "*" && ft != st:
			return false
		case !fmore || !smore:
			return fmore == smore
		}
		filter, subject = frest, srest
	}
}
