// Package turnlog appends a turn's events to its log and reads the log's
// last event: the one writer of the turn logs (issue 36, design (b),
// "the turn's events are the log"; the streams and subjects are
// jetstream/topology's TurnLogStreams).
//
// # Contract
//
// A turn's log is every message on topology.TurnLogWildcard of its
// partition, in stream order. Append adds one event to it by
// compare-and-set against the turn's last event:
//
//   - An append names the sequence of the event it follows (After; 0: the
//     turn has no event yet). The server stores it only if that is still
//     the turn's last event (Nats-Expected-Last-Subject-Sequence with
//     Nats-Expected-Last-Subject-Sequence-Subject on the turn's wildcard).
//     The check covers that turn only: appends of other turns of the same
//     partition never conflict with it.
//   - Every append carries a message id (by default "<turn>.<event>"), so
//     that the writer can tell its own stored write from another's.
//   - An append whose outcome is unknown (no acknowledgement: a timeout,
//     no responders, a lost stream answer) is sent again, the same message
//     with the same id, up to Attempts times. nats-server checks the
//     compare-and-set before the message id, so an attempt whose
//     predecessor was stored is refused with 10071 (wrong last sequence),
//     not answered as a duplicate; the same happens when a stage makes an
//     append again after a crash. On every refusal the writer reads the
//     turn's last event back: if it carries the append's subject and
//     message id, the append is the writer's own and succeeds with its
//     sequence; otherwise it fails with ErrConflict. Then either it was
//     never stored, or (made again after its acknowledgement was lost) it
//     was stored and the log has moved past it since: the log, read with
//     Last, says which, never the error.
//   - Append never overwrites and never reorders: a success means the
//     event is stored, once, directly after the event it names.
//
// Last reads a turn's last event (ErrNoEvents when it has none) from the
// stream leader where the stream has replicas (the streams allow direct
// gets only with one replica: topology.Config.DirectGets), so a stage
// reads the append another stage just made.
package turnlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Errors of Append and Last.
var (
	// ErrConflict: the turn's last event is not the one the append
	// named, and is not the append itself (another writer appended first,
	// or the caller's view of the turn is stale). Read Last and decide
	// again (the package's contract).
	ErrConflict = errors.New("turnlog: the turn's log has moved on")
	// ErrNoEvents: the turn has no event in its log.
	ErrNoEvents = errors.New("turnlog: the turn has no events")
	// ErrInvalid: a turn id or event name that is not a subject token of
	// the log (schemas.ValidKey for the turn; lower-case letters, digits
	// and '_' for the event).
	ErrInvalid = errors.New("turnlog: invalid turn id or event name")
)

// Defaults of the optional settings.
const (
	// DefaultAttempts is how many times an append whose acknowledgement
	// does not come is sent.
	DefaultAttempts = 3
	// DefaultAttemptTimeout bounds each attempt.
	DefaultAttemptTimeout = 5 * time.Second
)

// Log is the turn logs of one topology, on one connection. It is safe for
// concurrent use.
type Log struct {
	js         jetstream.JetStream
	partitions int
	streams    []jetstream.Stream

	attempts       int
	attemptTimeout time.Duration
	publish        func(context.Context, *nats.Msg) (*jetstream.PubAck, error)

	retries, own atomic.Int64
}

// Option is an optional setting of New.
type Option func(*Log)

// WithAttempts sets how many times an append is sent while its
// acknowledgement does not come (at least 1), and each attempt's bound.
func WithAttempts(n int, each time.Duration) Option {
	return func(l *Log) { l.attempts, l.attemptTimeout = max(n, 1), each }
}

// withPublish replaces the publish of every attempt (tests: an
// acknowledgement lost after the write was stored).
func withPublish(p func(context.Context, *nats.Msg) (*jetstream.PubAck, error)) Option {
	return func(l *Log) { l.publish = p }
}

// New binds the turn-log streams of topo on js. They must exist
// (Provision, or the deployment's provisioning). A stage binds those
// topology.OpenTurnLogs found instead (Bind), whose number is the
// server's.
func New(ctx context.Context, js jetstream.JetStream, topo topology.Config, opts ...Option) (*Log, error) {
	var streams []jetstream.Stream
	for i := range topo.TurnLogPartitionCount() {
		s, err := js.Stream(ctx, topology.TurnLogStream(i))
		if err != nil {
			return nil, fmt.Errorf("turnlog: stream %s: %w", topology.TurnLogStream(i), err)
		}
		streams = append(streams, s)
	}
	return Bind(js, streams, opts...), nil
}

// Bind is the Log of the turn-log streams given, by partition
// (topology.OpenTurnLogs), publishing through js.
func Bind(js jetstream.JetStream, streams []jetstream.Stream, opts ...Option) *Log {
	l := &Log{js: js, partitions: len(streams), streams: streams, attempts: DefaultAttempts, attemptTimeout: DefaultAttemptTimeout,
		publish: func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) { return js.PublishMsg(ctx, m) }}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Partitions is how many turn-log streams l spreads turns over.
func (l *Log) Partitions() int { return l.partitions }

// Provision creates or updates topo's turn-log streams on js, for the
// bench's raw turns and tests: it does not check that the streams keep
// their number of partitions (the product provisions them with
// topology.Ensure, which does).
func Provision(ctx context.Context, js jetstream.JetStream, topo topology.Config) error {
	if err := topo.Validate(); err != nil {
		return err
	}
	for _, sc := range topo.TurnLogStreams() {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("turnlog: provision %s: %w", sc.Name, err)
		}
	}
	return nil
}

// Event is one event of a turn's log as stored.
type Event struct {
	Turn  string
	Name  string // the event: the subject's last token
	Seq   uint64 // its stream sequence: the After of the next append
	MsgID string
	Data  []byte
	// Header is the stored message's headers (the compare-and-set and
	// message-id headers included).
	Header nats.Header
	Time   time.Time
}

// Append is one event to append to a turn's log.
type Append struct {
	Turn  string
	Event string
	// After is the sequence of the turn's last event as the writer read
	// it (Event.Seq); 0: the turn has no event yet.
	After uint64
	// MsgID identifies the append; "" is "<turn>.<event>". An event that a
	// turn can have more than once needs an id of its own per occurrence.
	MsgID  string
	Header nats.Header // more headers, stored with the event
	Data   []byte
}

// Partition is the partition of turn in l.
func (l *Log) Partition(turn string) int { return topology.TurnLogPartition(turn, l.partitions) }

// Append stores a after a.After and returns its stream sequence, or
// ErrConflict (the package's contract), ErrInvalid, or the error of the
// last attempt (the append may or may not be stored: make it again with
// the same message id and After, and it is recognised).
func (l *Log) Append(ctx context.Context, a Append) (uint64, error) {
	if !schemas.ValidKey(a.Turn) || !validEvent(a.Event) {
		return 0, fmt.Errorf("%w: turn %q, event %q", ErrInvalid, a.Turn, a.Event)
	}
	p := l.Partition(a.Turn)
	subject := topology.TurnLogSubject(p, a.Turn, a.Event)
	if a.MsgID == "" {
		a.MsgID = a.Turn + "." + a.Event
	}
	m := nats.NewMsg(subject)
	m.Data = a.Data
	for k, v := range a.Header {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(a.After, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, topology.TurnLogWildcard(p, a.Turn))
	m.Header.Set(jetstream.MsgIDHeader, a.MsgID)
	var err error
	for attempt := range l.attempts {
		if attempt > 0 {
			l.retries.Add(1)
		}
		actx, cancel := context.WithTimeout(ctx, l.attemptTimeout)
		var ack *jetstream.PubAck
		ack, err = l.publish(actx, m)
		cancel()
		switch {
		case err == nil:
			return ack.Sequence, nil
		case bus.WrongLast(err):
			last, rerr := l.last(ctx, p, a.Turn)
			if rerr == nil && last.Name == a.Event && last.MsgID == a.MsgID {
				l.own.Add(1)
				return last.Seq, nil
			}
			if rerr != nil && !errors.Is(rerr, ErrNoEvents) {
				return 0, fmt.Errorf("turnlog: append %s refused, and its read-back failed: %w", subject, rerr)
			}
			return 0, fmt.Errorf("append %s after %d: %w", subject, a.After, ErrConflict)
		case ctx.Err() != nil || !bus.UnknownOutcome(err):
			return 0, fmt.Errorf("turnlog: append %s: %w", subject, err)
		}
	}
	return 0, fmt.Errorf("turnlog: append %s: no acknowledgement after %d attempts: %w", subject, l.attempts, err)
}

// Last reads turn's last event, or ErrNoEvents.
func (l *Log) Last(ctx context.Context, turn string) (*Event, error) {
	if !schemas.ValidKey(turn) {
		return nil, fmt.Errorf("%w: turn %q", ErrInvalid, turn)
	}
	return l.last(ctx, l.Partition(turn), turn)
}

func (l *Log) last(ctx context.Context, p int, turn string) (*Event, error) {
	m, err := l.streams[p].GetLastMsgForSubject(ctx, topology.TurnLogWildcard(p, turn))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, ErrNoEvents
	case err != nil:
		return nil, fmt.Errorf("turnlog: read the last event of %s: %w", turn, err)
	}
	prefix := topology.TurnLogSubject(p, turn, "")
	if len(m.Subject) <= len(prefix) || m.Subject[:len(prefix)] != prefix {
		return nil, fmt.Errorf("turnlog: the last event of %s is on %q, not under %s", turn, m.Subject, prefix)
	}
	return &Event{Turn: turn, Name: m.Subject[len(prefix):], Seq: m.Sequence, MsgID: m.Header.Get(jetstream.MsgIDHeader),
		Data: m.Data, Header: m.Header, Time: m.Time}, nil
}

// Purge removes every event of turn from its log: for tests and tools
// that move a turn's record elsewhere (as an earlier version kept it). The
// stages never call it: a turn's log is its history, and it leaves with
// the stream's MaxAge.
func (l *Log) Purge(ctx context.Context, turn string) error {
	if !schemas.ValidKey(turn) {
		return fmt.Errorf("%w: turn %q", ErrInvalid, turn)
	}
	p := l.Partition(turn)
	if err := l.streams[p].Purge(ctx, jetstream.WithPurgeSubject(topology.TurnLogWildcard(p, turn))); err != nil {
		return fmt.Errorf("turnlog: purge %s: %w", turn, err)
	}
	return nil
}

// Stats are a Log's counts since New: attempts after the first (an
// acknowledgement that did not come), and refused appends recognised as
// the writer's own.
type Stats struct{ Retries, Own int64 }

// Stats returns l's counts.
func (l *Log) Stats() Stats { return Stats{Retries: l.retries.Load(), Own: l.own.Load()} }

// validEvent reports whether name is an event name: 1 to 32 of a-z, 0-9
// and '_'.
func validEvent(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Watcher follows the turn logs (Watch).
type Watcher struct {
	updates chan *Event
	cancel  context.CancelFunc
	done    chan struct{}
}

// Updates delivers the events Watch follows, and one nil once every
// partition has delivered the events it held when Watch began. It is
// closed after Stop, or when following any partition fails for good (its
// ordered consumer could not be made again). nats.go makes an ordered
// consumer again for as long as it takes after a reconnect, so a watch of
// a server that is away waits rather than ends.
func (w *Watcher) Updates() <-chan *Event { return w.updates }

// Stop ends the watch and waits for it to end.
func (w *Watcher) Stop() {
	w.cancel()
	<-w.done
}

// Watch follows the last events of every turn, as a KV watch follows a
// bucket's keys: first, partition by partition in stream order, the last
// event of each name of every turn the logs hold (so a turn's last event
// is the last of its events delivered), then every event appended since,
// in each partition's order. Each partition is read by an ordered consumer
// (created on the server, recreated from where it was after a reconnect),
// so a reader that restarts sees every turn again.
func (l *Log) Watch(ctx context.Context) (*Watcher, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &Watcher{updates: make(chan *Event, 1024), cancel: cancel, done: make(chan struct{})}
	type part struct {
		p    int
		it   jetstream.MessagesContext
		left uint64
	}
	var parts []part
	fail := func(err error) (*Watcher, error) {
		for _, pt := range parts {
			pt.it.Stop()
		}
		cancel()
		return nil, err
	}
	for p, s := range l.streams {
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{topology.SubjectTurnLogPrefix + strconv.Itoa(p) + ".>"},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			return fail(fmt.Errorf("turnlog: watch partition %d: %w", p, err))
		}
		it, err := c.Messages()
		if err != nil {
			return fail(fmt.Errorf("turnlog: watch partition %d: %w", p, err))
		}
		parts = append(parts, part{p: p, it: it, left: c.CachedInfo().NumPending})
	}
	var caughtUp sync.WaitGroup
	var running sync.WaitGroup
	for _, pt := range parts {
		caughtUp.Add(1)
		running.Add(1)
		go func() {
			defer running.Done()
			once := sync.OnceFunc(caughtUp.Done)
			defer once()
			if pt.left == 0 {
				once()
			}
			prefix := topology.SubjectTurnLogPrefix + strconv.Itoa(pt.p) + "."
			for {
				m, err := pt.it.Next()
				if err != nil {
					// Stopped, or the partition's consumer is gone for
					// good: the whole watch ends, so that its reader
					// starts a new one rather than miss a partition.
					cancel()
					return
				}
				if ev := eventOf(m, prefix); ev != nil {
					select {
					case w.updates <- ev:
					case <-ctx.Done():
						return
					}
				}
				if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
					once()
				}
			}
		}()
	}
	go func() {
		<-ctx.Done()
		for _, pt := range parts {
			pt.it.Stop()
		}
	}()
	go func() {
		caughtUp.Wait()
		select {
		case w.updates <- nil:
		case <-ctx.Done():
		}
		running.Wait()
		close(w.updates)
		close(w.done)
	}()
	return w, nil
}

// eventOf is the Event of m, a message of the partition whose subjects
// start with prefix; nil for a subject that is not a turn's event.
func eventOf(m jetstream.Msg, prefix string) *Event {
	rest, ok := strings.CutPrefix(m.Subject(), prefix)
	turn, name, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || turn == "" || name == "" || strings.Contains(name, ".") {
		return nil
	}
	ev := &Event{Turn: turn, Name: name, MsgID: m.Headers().Get(jetstream.MsgIDHeader), Data: m.Data(), Header: m.Headers()}
	if md, err := m.Metadata(); err == nil {
		ev.Seq, ev.Time = md.Sequence.Stream, md.Timestamp
	}
	return ev
}
