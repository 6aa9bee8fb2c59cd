// Package eventfeed serves a process's live event streams (the gateway's
// Server-Sent Events, the web inbox's live updates) from one consumer of
// TOLLGATE_EVENTS: an ordered consumer, made on first use, whose events
// are handed in memory to every subscriber whose subject filters they
// match.
//
// A subscriber that starts behind the feed (a client resuming with
// Last-Event-ID, or a turn's stream from its first event) first reads the
// events it missed from the stream, through a consumer of its own that is
// deleted as soon as it has caught up, and then goes on with the feed's
// events: each event once, in stream order, none missed.
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
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
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

// Subjects is what the feed follows: every subject of TOLLGATE_EVENTS.
const Subjects = "tollgate.event.>"

// Buffer is how many events a subscriber's buffer holds by default.
const Buffer = 256

// replayBatch is how many missed events a subscriber reads at once.
const replayBatch = 256

// replayIdle is how long the server keeps a catching-up subscriber's
// consumer after its last use, should its deletion fail.
const replayIdle = 30 * time.Second

// Event is one stored event.
type Event struct {
	Seq     uint64 // its sequence in TOLLGATE_EVENTS: the SSE id
	Subject string
	Data    []byte
}

// Feed hands the events of TOLLGATE_EVENTS to its subscribers. A process
// makes one and shares it between every surface that streams events.
type Feed struct {
	js  jetstream.JetStream
	log *slog.Logger

	mu     sync.Mutex
	stream jetstream.Stream
	cc     jetstream.ConsumeContext // nil: not following yet (or closed)
	last   uint64                   // the sequence of the last event handed out (or where the feed started)
	subs   map[*Sub]struct{}
	owners map[string]int // open streams by owner
}

// New returns a Feed reading TOLLGATE_EVENTS over js; it starts following
// the stream on its first subscriber.
func New(js jetstream.JetStream, logger *slog.Logger) *Feed {
	return &Feed{js: js, log: logger, subs: map[*Sub]struct{}{}, owners: map[string]int{}}
}

// Options describe a subscription.
type Options struct {
	// Filters are the subjects (NATS wildcards allowed) the subscriber
	// wants; none means every event.
	Filters []string
	// After: the subscriber gets the events stored after this sequence
	// (0: from the stream's first). A sequence beyond the stream's last is
	// refused: the error has code schemas.CodeInvalidInput.
	After uint64
	// New, when set, ignores After: only events stored from now on.
	New bool
	// Owner and Max cap the streams open at once: a subscription of an
	// owner that holds Max is refused ErrTooManyStreams. Max 0 is no cap.
	Owner string
	Max   int
	// Buffer is how many events the subscriber's buffer holds (default
	// Buffer).
	Buffer int
}

// Subscribe starts a subscription. Close it when done. It fails with
// ErrTooManyStreams, an INVALID_INPUT error for an After beyond the
// stream, or the bus's error when the stream cannot be read.
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
	last, stream := f.last, f.stream
	f.mu.Unlock()
	if !o.New && o.After > last {
		// Ahead of this feed: another process may have handed it out a
		// moment ago; the stream says whether it exists.
		info, err := stream.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("eventfeed: stream info: %w", err)
		}
		if o.After > info.State.LastSeq {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %d is beyond the last event stored (%d)", o.After, info.State.LastSeq)
		}
	}

	s := &Sub{f: f, filters: filters, owner: o.Owner, ch: make(chan Event, cmp.Or(o.Buffer, Buffer)), done: make(chan struct{})}
	f.mu.Lock()
	if f.cc == nil {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	if o.Max > 0 && f.owners[o.Owner] >= o.Max {
		f.mu.Unlock()
		return nil, ErrTooManyStreams
	}
	// From here every event the feed hands out, those after f.last, goes
	// to the buffer; the replay reads those up to f.last.
	s.after, s.until = max(o.After, f.last), f.last
	if o.New {
		s.after = f.last
	}
	f.owners[o.Owner]++
	f.subs[s] = struct{}{}
	f.mu.Unlock()

	if !o.New && o.After < s.until {
		if err := s.startReplay(ctx, stream, o.After); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// startLocked follows the stream from its last event, if not yet.
func (f *Feed) startLocked(ctx context.Context) error {
	if f.cc != nil {
		return nil
	}
	stream, err := f.js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return fmt.Errorf("eventfeed: stream %s: %w", topology.StreamEvents, err)
	}
	last := stream.CachedInfo().State.LastSeq
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{Subjects},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: last + 1,
	})
	if err != nil {
		return fmt.Errorf("eventfeed: consumer: %w", err)
	}
	cc, err := cons.Consume(f.hand, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		f.log.Warn("eventfeed: following the events stream", "err", err)
	}))
	if err != nil {
		return fmt.Errorf("eventfeed: consume: %w", err)
	}
	f.stream, f.cc, f.last = stream, cc, last
	return nil
}

// hand gives m to each subscriber that wants it; one whose buffer is full
// is cut off. The ordered consumer calls it once per event, in order.
func (f *Feed) hand(m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	ev := Event{Seq: meta.Sequence.Stream, Subject: m.Subject(), Data: m.Data()}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.Seq <= f.last {
		return
	}
	f.last = ev.Seq
	for s := range f.subs {
		if ev.Seq <= s.after || !s.wants(ev.Subject) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			s.cutLocked(ErrSlow)
		}
	}
}

// Close stops following the stream and cuts every subscriber off with
// ErrClosed. A later Subscribe starts the feed again.
func (f *Feed) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cc != nil {
		f.cc.Stop()
		f.cc = nil
	}
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
	after   uint64 // the feed hands over only events after this one
	ch      chan Event
	done    chan struct{} // closed when cut off; err says why
	err     error
	closed  bool

	// The replay of the events missed, up to until, read before ch.
	stream  jetstream.Stream
	replay  jetstream.Consumer // nil: caught up
	until   uint64
	pending []Event
}

// Next returns the subscription's next event: those missed first, then
// the feed's. It waits until there is one, ctx ends (ctx's error) or the
// subscriber is cut off (ErrSlow, ErrClosed).
func (s *Sub) Next(ctx context.Context) (Event, error) {
	for len(s.pending) == 0 && s.replay != nil {
		if err := s.readReplay(); err != nil {
			return Event{}, err
		}
	}
	if len(s.pending) > 0 {
		ev := s.pending[0]
		s.pending = s.pending[1:]
		return ev, nil
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

// startReplay makes the consumer that reads the events after `after`
// matching the filters, up to s.until.
func (s *Sub) startReplay(ctx context.Context, stream jetstream.Stream, after uint64) error {
	cfg := jetstream.ConsumerConfig{
		Name:          "replay-" + rand.Text(),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckNonePolicy,
		MemoryStorage: true, Replicas: 1,
		InactiveThreshold: replayIdle,
	}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	if len(s.filters) == 1 {
		cfg.FilterSubject = s.filters[0]
	} else {
		cfg.FilterSubjects = s.filters
	}
	cons, err := stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("eventfeed: replay consumer: %w", err)
	}
	s.stream, s.replay = stream, cons
	return nil
}

// readReplay reads the next batch of missed events into pending; when
// there are no more up to s.until, it ends the replay.
func (s *Sub) readReplay() error {
	batch, err := s.replay.FetchNoWait(replayBatch)
	if err != nil {
		s.endReplay()
		return fmt.Errorf("eventfeed: replay: %w", err)
	}
	n, done := 0, false
	for m := range batch.Messages() {
		n++
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		if meta.Sequence.Stream > s.until {
			done = true // the feed hands this one and the later ones over
			continue
		}
		s.pending = append(s.pending, Event{Seq: meta.Sequence.Stream, Subject: m.Subject(), Data: m.Data()})
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		s.endReplay()
		return fmt.Errorf("eventfeed: replay: %w", err)
	}
	if n == 0 || done {
		s.endReplay()
	}
	return nil
}

// endReplay deletes the replay's consumer, if any.
func (s *Sub) endReplay() {
	if s.replay == nil {
		return
	}
	name := s.replay.CachedInfo().Name
	s.replay = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		s.f.log.Warn("eventfeed: delete a replay consumer (the server drops it when idle)", "consumer", name, "err", err)
	}
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
