// Package turnorder appends turns to their session's order and reads it:
// the one writer of the subjects jetstream/topology names OrderSubject.
//
// # Contract
//
// A session's order is every message on topology.OrderWildcard of its
// session key in TOLLGATE_TURNS, in stream order: its entries. Each entry
// is an accepted turn (an AcceptedTurn body, byte for byte what the
// appender gave) of one of two kinds, topology.OrderExec (the executor
// runs it) or topology.OrderPlan (the planner does). Append adds one entry
// by compare-and-set against the session's last entry:
//
//   - The append names the sequence of the session's last entry as the
//     writer read it (0: the session has none), with
//     Nats-Expected-Last-Subject-Sequence and
//     Nats-Expected-Last-Subject-Sequence-Subject = the session's wildcard.
//     The server stores it only if that entry is still the last, so two
//     writers never place two turns after the same entry: the order is one
//     line, whatever the number of writers.
//   - The entry is stamped, in headers, with the turn of the entry before
//     it (topology.HeaderOrderAfter; absent on a session's first entry) and
//     the session's arrival watermark (topology.HeaderOrderArrival: the
//     highest Arrival of any entry up to and including it). The stored
//     Nats-Expected-Last-Subject-Sequence header is the sequence of the
//     entry before it. Stamp reads these back from a delivered message.
//   - Every append carries the message id topology.OrderMsgID(turn) (a
//     repeat: topology.OrderRepeatMsgID, Append.Repeat). An
//     append whose outcome is unknown (no acknowledgement) is sent again,
//     the same message, up to the writer's attempts. A refused
//     compare-and-set (10071: another entry came first, or the writer's
//     view of the session was stale, or an earlier attempt of this very
//     append was stored) is answered by reading the session's last entry:
//     if it is this append (same turn and message id), the append
//     succeeds with it; otherwise the append is made again after the new
//     last entry, and the server's duplicate window recognises an earlier
//     attempt that was stored further back (the answer is then that entry,
//     read by its sequence). From the second refusal in a row the writer
//     pauses a random while (up to a millisecond per refusal) before it
//     tries again, so that writers racing for one session take turns.
//     After MaxConflicts refusals in a row Append fails with ErrConflict,
//     and the caller tries again later.
//   - Append never reorders and never overwrites. A turn appended again
//     after the duplicate window (two minutes by default) becomes a second
//     entry of the same turn: its stages act on a turn once (its batch
//     record is created once), so a repeated entry runs nothing twice.
//
// A Writer remembers the last entry it wrote or read of each of its most
// recent sessions (a session found empty, or assumed new: AssumeNew,
// too), so a session busy with one ingest writes without reading first,
// and a new session's first append reads its order once at most; a stale
// memory costs one refused append and a read.
//
// Last reads a session's last entry, and Next the entry after a given
// one, from the stream leader where the stream has replicas
// (TOLLGATE_TURNS allows no direct gets), so a reader sees what another
// writer just appended.
package turnorder

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Errors of Append, Last and Stamp.
var (
	// ErrConflict: MaxConflicts appends in a row found another entry
	// last. The caller tries again later (a transient error).
	ErrConflict = errors.New("turnorder: the session's order kept moving")
	// ErrEmpty: the session has no entry.
	ErrEmpty = errors.New("turnorder: the session has no entries")
	// ErrInvalid: a session key or turn id that is not a subject token
	// (schemas.ValidKey), or a kind other than topology.OrderExec and
	// topology.OrderPlan.
	ErrInvalid = errors.New("turnorder: invalid session key, turn id or kind")
)

// Defaults of the optional settings.
const (
	// DefaultAttempts is how many times an append whose acknowledgement
	// does not come is sent.
	DefaultAttempts = 3
	// DefaultAttemptTimeout bounds each attempt.
	DefaultAttemptTimeout = 5 * time.Second
	// MaxConflicts is how many refused appends in a row Append takes
	// before it gives up with ErrConflict.
	MaxConflicts = 16
	// DefaultRemembered is how many sessions' last entries a Writer
	// remembers.
	DefaultRemembered = 8192
)

// Entry is one entry of a session's order as stored.
type Entry struct {
	Kind string // topology.OrderExec or topology.OrderPlan
	Key  string // the session key
	Turn string // the accepted turn's id
	Seq  uint64 // its TOLLGATE_TURNS sequence
	// After is the turn of the entry before it ("" for the session's
	// first), at sequence AfterSeq.
	After    string
	AfterSeq uint64
	// Arrival is the session's arrival watermark after this entry.
	Arrival uint64
	MsgID   string
	Data    []byte      // the AcceptedTurn, as appended
	Header  nats.Header // the stored headers
	Time    time.Time
}

// Repeated reports whether e is a repeated entry of its turn (Append's
// Repeat: message id topology.OrderRepeatMsgID), which raises the
// session's watermark and places nothing.
func (e *Entry) Repeated() bool {
	_, arrival, ok := topology.ParseOrderMsgID(e.MsgID)
	return ok && arrival != 0
}

// Place is the place in its session's order that e gives its turn: its
// sequence and the turn before it. A repeated entry, and a nil one,
// place nothing (0, "").
func (e *Entry) Place() (seq uint64, after string) {
	if e == nil || e.Repeated() {
		return 0, ""
	}
	return e.Seq, e.After
}

// Delivered is the entry of turn that m, delivered by a consumer of an
// order subject, is: its stamp (Stamp) and stream sequence. It is nil when
// the stamp does not read or names another turn (not this package's
// writing), or m carries no metadata: the caller then treats the turn as
// one that came outside the order.
func Delivered(m jetstream.Msg, turn string) *Entry {
	e, err := Stamp(m.Subject(), m.Headers())
	if err != nil || e.Turn != turn {
		return nil
	}
	md, err := m.Metadata()
	if err != nil {
		return nil
	}
	e.Seq = md.Sequence.Stream
	return e
}

// Append is one turn to append to its session's order.
type Append struct {
	Kind string // topology.OrderExec or topology.OrderPlan
	Key  string // the session key (schemas.SessionKeyOf of the turn's context)
	Turn string
	// Arrival is the turn's TOLLGATE_INBOUND sequence for a turn ordered
	// by arrival (0: a turn that is not, such as a follow-up). The
	// session's watermark is raised to it.
	Arrival uint64
	Data    []byte      // the encoded AcceptedTurn
	Header  nats.Header // more headers (a trace context), stored with it
	// Repeat appends a turn that is in the order already again, for a
	// later delivery of its inbound message (Arrival, which must be set),
	// so that the session's watermark covers that delivery: message id
	// topology.OrderRepeatMsgID(Turn, Arrival), one entry per delivery.
	Repeat bool
}

// Writer appends to and reads the sessions' orders of one TOLLGATE_TURNS,
// on one connection. It is safe for concurrent use.
type Writer struct {
	js             jetstream.JetStream
	stream         jetstream.Stream
	attempts       int
	attemptTimeout time.Duration
	publish        func(context.Context, *nats.Msg) (*jetstream.PubAck, error)
	lasts          *remembered

	retries, own, conflicts atomic.Int64
}

// Option sets an optional setting of a Writer.
type Option func(*Writer)

// WithAttempts sets how many times an append without an acknowledgement
// is sent, and how long each attempt waits.
func WithAttempts(n int, each time.Duration) Option {
	return func(w *Writer) { w.attempts, w.attemptTimeout = max(n, 1), each }
}

// WithRemembered sets how many sessions' last entries the Writer
// remembers (0: none, every append reads the session's last entry first).
func WithRemembered(n int) Option { return func(w *Writer) { w.lasts = newRemembered(n) } }

// withPublish replaces the publish call (tests: a lost acknowledgement).
func withPublish(p func(context.Context, *nats.Msg) (*jetstream.PubAck, error)) Option {
	return func(w *Writer) { w.publish = p }
}

// New returns a Writer on TOLLGATE_TURNS (one stream lookup).
func New(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Writer, error) {
	s, err := js.Stream(ctx, topology.StreamTurns)
	if err != nil {
		return nil, fmt.Errorf("turnorder: stream %s: %w", topology.StreamTurns, err)
	}
	w := &Writer{js: js, stream: s, attempts: DefaultAttempts, attemptTimeout: DefaultAttemptTimeout,
		lasts: newRemembered(DefaultRemembered)}
	w.publish = func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) { return js.PublishMsg(ctx, m) }
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Append adds a to its session's order and returns the stored entry
// (the package's contract), or ErrInvalid, ErrConflict, or the error of
// the last attempt (the append may or may not be stored: make it again,
// and it is recognised).
func (w *Writer) Append(ctx context.Context, a Append) (*Entry, error) {
	if !validKind(a.Kind) || !schemas.ValidKey(a.Key) || !schemas.ValidKey(a.Turn) {
		return nil, fmt.Errorf("%w: kind %q, session %q, turn %q", ErrInvalid, a.Kind, a.Key, a.Turn)
	}
	msgID := topology.OrderMsgID(a.Turn)
	if a.Repeat {
		if a.Arrival == 0 {
			return nil, fmt.Errorf("%w: a repeated entry of %s without its arrival", ErrInvalid, a.Turn)
		}
		msgID = topology.OrderRepeatMsgID(a.Turn, a.Arrival)
	}
	last := w.lasts.get(a.Key)
	for conflicts := 0; ; {
		if last == nil {
			var err error
			if last, err = w.Last(ctx, a.Key); errors.Is(err, ErrEmpty) {
				last = &Entry{}
			} else if err != nil {
				return nil, err
			}
		}
		m := w.message(a, msgID, last)
		ack, err := w.send(ctx, m)
		switch {
		case err == nil && ack.Duplicate:
			// An earlier attempt was stored, before the entry this one
			// named: that one is the turn's entry.
			w.own.Add(1)
			w.lasts.forget(a.Key)
			return w.entryAt(ctx, ack.Sequence)
		case err == nil:
			e := stored(a, msgID, m, ack.Sequence, last)
			w.lasts.put(a.Key, e)
			return e, nil
		case !bus.WrongLast(err):
			w.lasts.forget(a.Key)
			return nil, err
		}
		w.lasts.forget(a.Key)
		now, rerr := w.Last(ctx, a.Key)
		switch {
		case rerr == nil && now.Turn == a.Turn && now.MsgID == msgID:
			w.own.Add(1)
			w.lasts.put(a.Key, now)
			return now, nil
		case errors.Is(rerr, ErrEmpty):
			now = &Entry{}
		case rerr != nil:
			return nil, fmt.Errorf("turnorder: append of %s to %s refused, and its read-back failed: %w", a.Turn, a.Key, rerr)
		}
		if conflicts++; conflicts >= MaxConflicts {
			return nil, fmt.Errorf("append %s to session %s: %w", a.Turn, a.Key, ErrConflict)
		}
		w.conflicts.Add(1)
		last = now
		if conflicts > 1 {
			// Writers racing for one session: a random pause, growing with
			// each refusal, lets them take turns (four writers on one
			// session without it hit MaxConflicts about once in five runs).
			t := time.NewTimer(rand.N(time.Duration(conflicts) * time.Millisecond))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("append %s to session %s: %w", a.Turn, a.Key, ctx.Err())
			case <-t.C:
			}
		}
	}
}

// message is a's message after last.
func (w *Writer) message(a Append, msgID string, last *Entry) *nats.Msg {
	m := nats.NewMsg(topology.OrderSubject(a.Kind, a.Key))
	m.Data = a.Data
	for k, v := range a.Header {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last.Seq, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, topology.OrderWildcard(a.Key))
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	m.Header.Del(topology.HeaderOrderAfter)
	if last.Turn != "" {
		m.Header.Set(topology.HeaderOrderAfter, last.Turn)
	}
	m.Header.Set(topology.HeaderOrderArrival, strconv.FormatUint(max(last.Arrival, a.Arrival), 10))
	return m
}

// stored is the entry m became at seq.
func stored(a Append, msgID string, m *nats.Msg, seq uint64, last *Entry) *Entry {
	return &Entry{Kind: a.Kind, Key: a.Key, Turn: a.Turn, Seq: seq, After: last.Turn, AfterSeq: last.Seq,
		Arrival: max(last.Arrival, a.Arrival), MsgID: msgID, Data: a.Data, Header: m.Header}
}

// send publishes m, again on an unknown outcome, up to the attempts.
func (w *Writer) send(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	var err error
	for attempt := range w.attempts {
		if attempt > 0 {
			w.retries.Add(1)
		}
		actx, cancel := context.WithTimeout(ctx, w.attemptTimeout)
		var ack *jetstream.PubAck
		ack, err = w.publish(actx, m)
		cancel()
		switch {
		case err == nil:
			return ack, nil
		case bus.WrongLast(err):
			return nil, err
		case ctx.Err() != nil || !bus.UnknownOutcome(err):
			return nil, fmt.Errorf("turnorder: append to %s: %w", m.Subject, err)
		}
	}
	return nil, fmt.Errorf("turnorder: append to %s: no acknowledgement after %d attempts: %w", m.Subject, w.attempts, err)
}

// Last reads the last entry of the session with key key, or ErrEmpty.
func (w *Writer) Last(ctx context.Context, key string) (*Entry, error) {
	if !schemas.ValidKey(key) {
		return nil, fmt.Errorf("%w: session %q", ErrInvalid, key)
	}
	m, err := w.stream.GetLastMsgForSubject(ctx, topology.OrderWildcard(key))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, ErrEmpty
	case err != nil:
		return nil, fmt.Errorf("turnorder: read the last entry of session %s: %w", key, err)
	}
	return entryOf(m)
}

// Next reads the first entry of the session with key key stored after
// sequence seq (0: the session's first entry), or ErrEmpty when it has
// none after seq yet. Whoever ends a turn finds the session's next turn
// so (its batch's OrderSeq). Like Last it is answered by the stream
// leader, so it sees every entry whose append was acknowledged before it.
func (w *Writer) Next(ctx context.Context, key string, seq uint64) (*Entry, error) {
	if !schemas.ValidKey(key) {
		return nil, fmt.Errorf("%w: session %q", ErrInvalid, key)
	}
	m, err := w.stream.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(topology.OrderWildcard(key)))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, ErrEmpty
	case err != nil:
		return nil, fmt.Errorf("turnorder: read the entry of session %s after %d: %w", key, seq, err)
	}
	return entryOf(m)
}

// Watermark is the arrival watermark of the session with key key: that
// of the last entry the Writer remembers of it, or of its last entry as
// read (0 for a session with none). A remembered entry may be stale
// (another writer appended since): its watermark is then lower, never
// higher, than the session's. Forget makes the next call read.
func (w *Writer) Watermark(ctx context.Context, key string) (uint64, error) {
	if wm, ok := w.Known(key); ok {
		return wm, nil
	}
	e, err := w.Last(ctx, key)
	switch {
	case errors.Is(err, ErrEmpty):
		// Remembered as empty, so that the append that follows (ingest
		// reads the watermark, then appends) names "no entry" without
		// reading again: a new session's first turn reads its order once.
		// Like any memory it may be stale; the append's compare-and-set
		// then refuses it and reads.
		e = &Entry{}
	case err != nil:
		return 0, err
	}
	w.lasts.put(key, e)
	return e.Arrival, nil
}

// Known is the arrival watermark of the last entry the Writer remembers
// of the session with key key, and whether it remembers the session at
// all (found empty counts); it reads nothing. Watermark is Known, else a
// read.
func (w *Writer) Known(key string) (watermark uint64, ok bool) {
	if e := w.lasts.get(key); e != nil {
		return e.Arrival, true
	}
	return 0, false
}

// AssumeNew makes the Writer remember the session with key key as having
// no entry, without reading its order, unless it remembers the session
// already. It is for a caller that knows of nothing that could have made
// an entry of the session: ingest, when no inbound message of the session
// is stored before the turn's own, saves the read Watermark would make.
// The assumption is a memory like any other: should it be wrong (an entry
// of a turn whose inbound message the stream no longer keeps), the
// append's compare-and-set refuses it, and the append reads the last
// entry and is made after it, as after any stale memory.
func (w *Writer) AssumeNew(key string) {
	w.lasts.put(key, &Entry{}) // put keeps a remembered entry: none is before sequence 0
}

// Forget drops what the Writer remembers of the session with key key.
func (w *Writer) Forget(key string) { w.lasts.forget(key) }

// At reads the entry stored at TOLLGATE_TURNS sequence seq (a message
// there that is not an order entry is MALFORMED, as Stamp says), from the
// stream leader: a reader stepping back through a session's order over
// the entries that place nothing (Entry.Place).
func (w *Writer) At(ctx context.Context, seq uint64) (*Entry, error) {
	return w.entryAt(ctx, seq)
}

// entryAt reads the entry stored at seq.
func (w *Writer) entryAt(ctx context.Context, seq uint64) (*Entry, error) {
	m, err := w.stream.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("turnorder: read the entry at %d: %w", seq, err)
	}
	return entryOf(m)
}

func entryOf(m *jetstream.RawStreamMsg) (*Entry, error) {
	e, err := Stamp(m.Subject, m.Header)
	if err != nil {
		return nil, err
	}
	e.Seq, e.Data, e.Header, e.Time = m.Sequence, m.Data, m.Header, m.Time
	return e, nil
}

// Stamp reads what the order says of an entry stored on subject with
// headers hdr: its kind, session, turn (from its message id), the entry
// before it and the session's watermark after it (Entry's Kind, Key,
// Turn, After, AfterSeq, Arrival and MsgID; the caller knows the rest). A
// subject outside the orders, or headers that are not an append's (a
// message id that is not topology.OrderMsgID (or OrderRepeatMsgID) of a turn id, an After that
// is not a turn id, a number that does not parse, an After without its
// sequence), is MALFORMED: such a message was not written by this
// package.
func Stamp(subject string, hdr nats.Header) (*Entry, error) {
	kind, key, ok := topology.ParseOrderSubject(subject)
	if !ok || !schemas.ValidKey(key) {
		return nil, schemas.Errorf(schemas.CodeMalformed, "%s is not a session's order", subject)
	}
	e := &Entry{Kind: kind, Key: key, After: hdr.Get(topology.HeaderOrderAfter), MsgID: hdr.Get(jetstream.MsgIDHeader)}
	turn, _, ok := topology.ParseOrderMsgID(e.MsgID)
	if !ok || !schemas.ValidKey(turn) {
		return nil, schemas.Errorf(schemas.CodeMalformed, "entry of session %s has message id %q: not an order entry's", key, e.MsgID)
	}
	e.Turn = turn
	var err error
	if e.AfterSeq, err = number(hdr, jetstream.ExpectedLastSubjSeqHeader); err != nil {
		return nil, err
	}
	if e.Arrival, err = number(hdr, topology.HeaderOrderArrival); err != nil {
		return nil, err
	}
	switch {
	case e.After != "" && !schemas.ValidKey(e.After):
		return nil, schemas.Errorf(schemas.CodeMalformed, "entry of session %s names %q before it: not a turn id", key, e.After)
	case (e.After == "") != (e.AfterSeq == 0):
		return nil, schemas.Errorf(schemas.CodeMalformed, "entry of session %s names turn %q before it at sequence %d", key, e.After, e.AfterSeq)
	}
	return e, nil
}

// number is the decimal header name of hdr (0 when absent).
func number(hdr nats.Header, name string) (uint64, error) {
	v := hdr.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, schemas.Errorf(schemas.CodeMalformed, "header %s: %q is not a sequence", name, v)
	}
	return n, nil
}

// Stats are a Writer's counts since New: attempts after the first (an
// acknowledgement that did not come), refused or duplicate appends
// recognised as the writer's own, and appends made again after another
// entry came first.
type Stats struct{ Retries, Own, Conflicts int64 }

// Stats returns w's counts.
func (w *Writer) Stats() Stats {
	return Stats{Retries: w.retries.Load(), Own: w.own.Load(), Conflicts: w.conflicts.Load()}
}

func validKind(k string) bool { return k == topology.OrderExec || k == topology.OrderPlan }

// remembered is a bounded map of session keys to their last entries, the
// oldest forgotten first.
type remembered struct {
	mu   sync.Mutex
	m    map[string]*Entry
	ring []string
	next int
}

func newRemembered(n int) *remembered {
	if n <= 0 {
		return nil
	}
	return &remembered{m: make(map[string]*Entry, n), ring: make([]string, n)}
}

func (r *remembered) get(key string) *Entry {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[key]
}

// put remembers e as key's last entry, unless a later one is remembered.
// It keeps a copy without the entry's turn and headers: an append needs
// only the last entry's place (Turn, Seq, Arrival), and a Writer
// remembering thousands of sessions would otherwise keep every one's
// accepted turn alive, for the collector to scan.
func (r *remembered) put(key string, e *Entry) {
	if r == nil {
		return
	}
	slim := *e
	slim.Data, slim.Header = nil, nil
	e = &slim
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.m[key]; ok {
		if cur.Seq < e.Seq {
			r.m[key] = e
		}
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.m, old)
	}
	r.ring[r.next] = key
	r.m[key] = e
	r.next = (r.next + 1) % len(r.ring)
}

func (r *remembered) forget(key string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, key)
}
