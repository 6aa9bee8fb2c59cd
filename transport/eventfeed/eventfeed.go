// Package eventfeed serves a process's live event streams (the gateway's
// Server-Sent Events, the web inbox's live updates, `tollgate chat`) from
// one set of consumers, made on first use: an ordered consumer of
// TOLLGATE_EVENTS and one of each turn-log partition's outcome and
// awaiting events (tollgate.turnlog.<i>.*.outcome and .awaiting,
// docs/protocol.md §4.2a). Their events are merged in the order they
// arrive and handed in memory to every subscriber whose subject filters
// they match.
//
// A turn's outcome is made durable once, by the write that ends its batch
// in its turn's log, and the approvals a batch requests by its move to
// awaiting there. The feed hands each out as the event it replaces, byte
// for byte what is (or was) published on that subject: the outcome as
// tollgate.event.turn.outcome.<turn>, data the TurnOutcome alone
// (schemas.Encode); each request the awaiting event keeps, in the order it
// lists them, as tollgate.event.approval.requested.<turn>, data the
// ApprovalRecord (store.DecodeRequested, schemas.Encode). An awaiting
// event that keeps none (an earlier version's, or a second move to
// awaiting) stands for no event. A published copy (for a batch kept in
// tollgate_batches, or a turn of an earlier version; this version's
// approval requests too, while they are still published) is handed out
// only when its turn's log does not keep that outcome or request: each
// comes once.
//
// Order: each stream's events keep their order, so a turn's requests come
// before its outcome. A turn's outcome comes after every event of that
// turn stored before it ended (its approvals requested and decided, its
// redrives): the feed holds an outcome from a log until it has handed out
// the turn's last event in TOLLGATE_EVENTS at the time the outcome
// arrived (one direct get per outcome). An approval's decided and voted
// events come after its request: the feed holds one whose request a log
// keeps until it has handed out that partition up to the awaiting event
// (one direct get per such event, and per published request, to read the
// awaiting event). A stream's later events wait behind a held one. Should
// TOLLGATE_EVENTS wait for a partition whose held outcome waits for
// TOLLGATE_EVENTS, the outcome goes first.
//
// Each event carries the feed's position after it, a Cursor (the SSE id):
// a subscriber that starts there (Options.After) gets the events handed
// out after it and no other. The requests of one awaiting event share its
// sequence: each but the last carries a split position (cursor.go), which
// names the event and how many of its requests were out, so a subscriber
// resuming after one of them gets the next one, each once. A subscriber that starts
// behind the feed (a client resuming with Last-Event-ID, or a turn's
// stream from its first event) first reads the events it missed from the
// streams, through consumers of its own that are deleted as soon as it
// has caught up, by the same rules of order, then goes on with the feed's
// events: each event once, none missed.
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

// maxPartitions bounds the turn-log partitions a cursor names.
const maxPartitions = topology.MaxTurnLogPartitions

// Event is one event as the feed hands it out.
type Event struct {
	// ID is the feed's position after this event: Options.After = ID
	// resumes after it. Its String is the SSE id.
	ID Cursor
	// Source is the stream it was read from (0: TOLLGATE_EVENTS; 1+i:
	// TOLLGATE_TURNLOG_<i>), Seq its sequence there.
	Source int
	Seq    uint64
	// Subject is a TOLLGATE_EVENTS subject: a turn's outcome read from
	// its log is tollgate.event.turn.outcome.<turn>, a request read from
	// its awaiting event tollgate.event.approval.requested.<turn>.
	Subject string
	// Data is the event's record (msgpack): for an outcome, the
	// TurnOutcome alone; for a request, its ApprovalRecord.
	Data []byte

	skip  bool   // a message that stands for no event (a published copy a log keeps): advances the position only
	more  bool   // (request from a log) another of its awaiting event's requests follows: the position stays before that event
	part  int    // (request from a log) its place among its awaiting event's requests, from 1
	after uint64 // (outcome from a log) the turn's last TOLLGATE_EVENTS sequence it waits for
	// (an approval's decided or voted event) the partition and sequence of
	// the awaiting event that keeps its request, which it waits for (0:
	// none).
	waitPart int
	waitSeq  uint64
}

// source is one stream the feed follows.
type source struct {
	stream  jetstream.Stream
	filters []string
	cc      jetstream.ConsumeContext
}

// Feed hands the events of TOLLGATE_EVENTS, and the turns' outcomes and
// requests from the turn logs, to its subscribers. A process makes one
// and shares it between every surface that streams events.
type Feed struct {
	js  jetstream.JetStream
	log *slog.Logger

	mu     sync.Mutex
	gen    int       // bumped by every start: callbacks of an earlier one are ignored
	srcs   []*source // nil: not following yet (or closed); [0] events, [1+i] turn log i
	last   Cursor    // per source, the last message handed out (or where the feed started)
	seen   Cursor    // per source, the last message received (held ones included)
	held   [][]Event // per partition, its events from a held outcome on (waiting for the events stream), in order
	wait   []Event   // the events stream's, from a held decision or vote on (waiting for a partition), in order
	subs   map[*Sub]struct{}
	owners map[string]int // open streams by owner

	beforeLog func(subject string) // (tests) called with each turn-log message the feed follows, before it reads it
}

// New returns a Feed reading over js; it starts following the streams on
// its first subscriber. The turn-log streams must exist (topology.Ensure).
func New(js jetstream.JetStream, logger *slog.Logger) *Feed {
	return &Feed{js: js, log: logger, subs: map[*Sub]struct{}{}, owners: map[string]int{}}
}

// Options describe a subscription.
type Options struct {
	// Filters are the subjects (NATS wildcards allowed) the subscriber
	// wants, in TOLLGATE_EVENTS's namespace (a turn's outcome from its log
	// matches as tollgate.event.turn.outcome.<turn>, a request from its
	// log as tollgate.event.approval.requested.<turn>); none means every
	// event.
	Filters []string
	// After: the subscriber gets the events handed out after this cursor
	// (an Event.ID, or ParseCursor of an SSE id); nil: from the first
	// message of every stream. A cursor of one sequence (an SSE id of an
	// earlier version, a TOLLGATE_EVENTS sequence) reads TOLLGATE_EVENTS
	// after it and the turn logs from the time it was stored. A cursor of
	// another length than 1 or the feed's streams, or beyond a stream's
	// last message, is refused with code schemas.CodeInvalidInput.
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
	from, bare, since := make(Cursor, n), false, time.Time{}
	switch {
	case o.New, len(o.After) == 0:
	case len(o.After) == 1:
		from[0], bare = o.After[0], true
	case len(o.After) == n:
		copy(from, o.After)
	default:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %s names %d positions, want %d (or one, an events stream sequence)", o.After, len(o.After), n)
	}
	var sp split
	if !o.New {
		var err error
		if sp, err = splitOf(from); err != nil {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %s: %v", o.After, err)
		}
	}
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
		if bare && from[0] > 0 {
			m, err := srcs[0].stream.GetMsg(ctx, from[0])
			switch {
			case err == nil:
				since = m.Time
			case !errors.Is(err, jetstream.ErrMsgNotFound): // gone: the logs from their start
				return nil, fmt.Errorf("eventfeed: read event %d: %w", from[0], err)
			}
		}
	}

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
		if o.New || (bare && i > 0) {
			s.after[i] = f.last[i]
		}
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
	srcs := []*source{{stream: events, filters: []string{Subjects}}}
	for i, l := range logs {
		srcs = append(srcs, &source{stream: l, filters: []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i)}})
	}
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
		hand := func(m jetstream.Msg) { f.handEvent(gen, m) }
		if i > 0 {
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
	f.srcs, f.last, f.seen, f.held, f.wait = srcs, last, slices.Clone(last), make([][]Event, len(logs)), nil
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
// event whose request a log keeps waits for that awaiting event; any
// other is handed out as it is.
func (f *Feed) presentEvent(seq uint64, subject string, data []byte) Event {
	ev := Event{Seq: seq, Subject: subject, Data: data}
	if turn, ok := strings.CutPrefix(subject, topology.SubjectTurnOutcome); ok {
		ev.skip = f.logHolds(turn)
		return ev
	}
	turn, id, requested, ok := approvalOf(subject, data)
	if !ok {
		return ev
	}
	p, at, kept := f.loggedRequest(turn, id)
	switch {
	case !kept:
	case requested:
		ev.skip = true
	default:
		ev.waitPart, ev.waitSeq = p, at
	}
	return ev
}

// approvalOf reads the turn and approval of an approval's requested,
// decided or voted event (requested says which); false for any other
// event, or one that does not decode (handed out as it is).
func approvalOf(subject string, data []byte) (turn, id string, requested, ok bool) {
	var prefix string
	for _, p := range []string{topology.SubjectApprovalRequested, topology.SubjectApprovalDecided, topology.SubjectApprovalVoted} {
		if strings.HasPrefix(subject, p) {
			prefix = p
		}
	}
	if prefix == "" {
		return "", "", false, false
	}
	_, rec, err := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided, topology.RouteApprovalVoted)
	if err != nil {
		return "", "", false, false
	}
	switch r := rec.(type) {
	case *schemas.ApprovalRecord:
		id = r.ApprovalID
	case *schemas.DecidedEvent:
		id = r.ApprovalID
	case *schemas.VotedEvent:
		id = r.ApprovalID
	}
	return strings.TrimPrefix(subject, prefix), id, prefix == topology.SubjectApprovalRequested, id != ""
}

// handLog takes an event of turn-log partition p (presentLog): it waits
// behind the partition's held ones, then is handed to the subscribers
// that want it. The ordered consumer calls it once per message, in order.
func (f *Feed) handLog(gen, p int, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	if f.beforeLog != nil {
		f.beforeLog(m.Subject())
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
	switch {
	case ok && event == store.EventOutcome:
		return []Event{f.presentOutcome(p, seq, turn, subject, data)}
	case ok && event == store.EventAwaiting:
		if evs := f.presentRequests(p, seq, turn, subject, data); len(evs) > 0 {
			return evs
		}
	}
	return []Event{{Source: 1 + p, Seq: seq, skip: true}}
}

// presentOutcome is the event a turn log's outcome message stands for:
// the turn's outcome event, waiting for the turn's last event in
// TOLLGATE_EVENTS; a message that holds no outcome is passed over (skip),
// with a warning.
func (f *Feed) presentOutcome(p int, seq uint64, turn, subject string, data []byte) Event {
	ev := Event{Source: 1 + p, Seq: seq, skip: true}
	o, err := store.DecodeOutcome(turn, data)
	if errors.Is(err, store.ErrNoOutcome) {
		return ev // its published outcome is handed out (logHolds)
	}
	if err == nil {
		ev.Data, err = schemas.Encode(o)
	}
	if err != nil {
		f.log.Warn("eventfeed: an outcome event that holds no outcome is passed over", "subject", subject, "seq", seq, "err", err)
		return ev
	}
	ev.Subject, ev.skip = topology.EventSubject(topology.SubjectTurnOutcome, turn), false
	ev.after = f.lastEventOf(turn)
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

// releaseLocked hands out, in each stream's order, the held events that
// may go: TOLLGATE_EVENTS's once the one at their head finds the feed
// past the awaiting event it waits for; each partition's once the outcome
// at its head finds the feed past its turn's events. When TOLLGATE_EVENTS
// waits for a partition whose head waits for TOLLGATE_EVENTS, neither
// could ever go: that outcome goes first (the event it waits for is at or
// after a decision on a request stored after the outcome: its turn had
// ended).
func (f *Feed) releaseLocked() {
	for {
		moved := false
		for len(f.wait) > 0 && (f.wait[0].waitSeq == 0 || f.wait[0].waitSeq <= f.last[1+f.wait[0].waitPart]) {
			ev := f.wait[0]
			f.wait = f.wait[1:]
			f.last[0] = ev.Seq
			if !ev.skip {
				f.handLocked(ev)
			}
			moved = true
		}
		for p, q := range f.held {
			for len(q) > 0 && q[0].after <= f.last[0] {
				f.handLogLocked(q[0])
				q, moved = q[1:], true
			}
			f.held[p] = q
		}
		if moved {
			continue
		}
		if len(f.wait) == 0 || len(f.held[f.wait[0].waitPart]) == 0 {
			return
		}
		p := f.wait[0].waitPart
		f.log.Debug("eventfeed: an outcome and a decision wait for each other: the outcome goes first", "stream", topology.TurnLogStream(p), "seq", f.held[p][0].Seq)
		f.handLogLocked(f.held[p][0])
		f.held[p] = f.held[p][1:]
	}
}

// handLogLocked hands out ev, a turn log's event: the position moves to
// its message once the last event it stands for is out.
func (f *Feed) handLogLocked(ev Event) {
	if !ev.more {
		f.last[ev.Source] = ev.Seq
	}
	if !ev.skip {
		f.handLocked(ev)
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
		if ev.Seq <= s.after[ev.Source] || s.split.covers(ev) || !s.wants(ev.Subject) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			s.cutLocked(ErrSlow)
		}
	}
}

// logs are the turn-log streams the feed follows (none before it starts).
func (f *Feed) logs() []jetstream.Stream {
	f.mu.Lock()
	srcs := f.srcs
	f.mu.Unlock()
	if len(srcs) < 2 {
		return nil
	}
	logs := make([]jetstream.Stream, len(srcs)-1)
	for i, s := range srcs[1:] {
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
// held), with a warning.
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

// lastEventOf is the sequence of turn's last event in TOLLGATE_EVENTS (0:
// none). Should it not be read, 0 (the outcome is not held), with a
// warning.
func (f *Feed) lastEventOf(turn string) uint64 {
	f.mu.Lock()
	srcs := f.srcs
	f.mu.Unlock()
	if len(srcs) == 0 || !schemas.ValidKey(turn) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupWait)
	defer cancel()
	m, err := srcs[0].stream.GetLastMsgForSubject(ctx, turnEvents(turn))
	switch {
	case err == nil:
		return m.Sequence
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		f.log.Warn("eventfeed: the turn's last event could not be read: its outcome is not held for it", "turn", turn, "err", err)
	}
	return 0
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
	f.srcs, f.held, f.wait = nil, nil, nil
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
	logs := logFilters(s.filters, len(srcs)-1)
	for i, src := range srcs {
		filters := s.filters
		if i > 0 {
			filters = logs[i-1]
		}
		byTime := bare && i > 0
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
	n := 0
	for m := range batch.Messages() {
		n++
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		seq := meta.Sequence.Stream
		if seq > s.until[r.i] {
			r.done = true // the feed hands this one and the later ones over
			continue
		}
		if r.i == 0 {
			r.buf = append(r.buf, s.f.presentEvent(seq, m.Subject(), m.Data()))
			continue
		}
		r.buf = append(r.buf, s.f.presentLog(r.i-1, seq, m.Subject(), m.Data())...)
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
// rest of an awaiting event's requests once one is out; else a turn log's
// next event, unless it is an outcome whose turn's last event the events
// replayed have not passed (while there are more); else the next event of
// TOLLGATE_EVENTS, unless it waits for an awaiting event the replay has
// not passed; else, when that partition's next event is such an outcome
// (each waits for the other), the outcome. false: nothing to hand out
// this time (a passed-over message, or the replay just ended).
func (s *Sub) nextReplayed(ctx context.Context) (Event, bool, error) {
	var events *replaySource
	for _, r := range s.replay {
		if len(r.buf) == 0 && !r.done {
			if err := s.fill(ctx, r); err != nil {
				s.endReplay()
				return Event{}, false, err
			}
		}
		if r.i == 0 {
			events = r
		}
	}
	eventsLeft := events != nil && len(events.buf) > 0
	pick := s.group
	if pick != nil && len(pick.buf) == 0 {
		pick = nil // (cannot be: an event's requests are read at once)
	}
	for _, r := range s.replay {
		if pick == nil && r.i > 0 && len(r.buf) > 0 && (!eventsLeft || r.buf[0].after <= s.cur[0]) {
			pick = r
		}
	}
	if pick == nil && eventsLeft {
		pick = events
		if ev := events.buf[0]; !s.passed(ev.waitPart, ev.waitSeq) {
			pick = s.replayOf(1 + ev.waitPart)
			if pick != nil && len(pick.buf) == 0 {
				pick = nil
			}
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
	if ev.skip || s.split.covers(ev) {
		return Event{}, false, nil
	}
	ev.ID = slices.Clone(s.cur)
	if ev.more {
		ev.ID[pick.i] = splitAt(ev.Seq, ev.part)
	}
	return ev, true, nil
}

// passed reports whether the replay has handed out partition p up to its
// message seq (0: none), or never will: it reads nothing of p at or
// before seq up to s.until (the feed hands out what comes after).
func (s *Sub) passed(p int, seq uint64) bool {
	if seq == 0 || s.cur[1+p] >= seq || seq > s.until[1+p] {
		return true
	}
	r := s.replayOf(1 + p)
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
