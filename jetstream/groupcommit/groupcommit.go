// Package groupcommit commits the JetStream writes that wait at the same
// time, on one stream, as one atomic batch (nats-server 2.12+, ADR-50), so
// that one disk flush serves many writers: a group committer.
//
// A writer publishes as it would with jetstream.JetStream.PublishMsg (a
// stream publish, or a KV create or update, which is a publish on
// $KV.<bucket>.<key> with Nats-Expected-Last-Subject-Sequence) and waits
// for its own answer. Below it, one committer per stream works like this:
//
//   - A write that finds no commit in flight on its stream goes out at once
//     as a plain publish, in the writer's goroutine: at low load nothing
//     changes, not even the latency.
//   - While a commit is in flight the next writes gather. When it ends, the
//     next commit takes every write gathered (up to Config.MaxBatch, 1,000
//     by default, the server's limit, and Config.MaxBatchBytes): fewer than
//     Config.MinBatch go out as plain publishes, pipelined (an atomic batch
//     costs a fixed number of disk flushes, about six on one server,
//     whatever its size, so small batches do not pay), more as one atomic
//     batch. No timer: the batch size follows the load.
//
// Semantics are kept per write. Every header travels with its message:
// Nats-Expected-Last-Subject-Sequence (a KV compare-and-set), Nats-TTL,
// Nats-Msg-Id. An atomic batch is all or nothing, so when the server
// refuses a batch (a failed compare-and-set, a duplicate message id, a
// message too large, any refusal it answers), nothing of it was stored, and
// the committer sends the batch's writes again one by one: each writer gets
// the answer its own write gets alone (for example a wrong-last-sequence
// APIError, or a PubAck with Duplicate set). Since a refusal costs the batch
// and then every write singly, the commits after one go singly (1, 2, 4, …
// up to 64 commits after refusals in a row) before batching again. A batch that gets no answer
// (timeout, connection lost) may or may not have been stored, exactly as a
// single publish that gets no answer: each of its writers gets that error.
//
// Order: writes are committed in the order they were submitted, per stream.
// A batch never holds two writes of one subject (a write whose subject is
// already in the gathered batch waits for the next commit), so two writes
// of one key keep their order and each its own revision check. A writer
// that waits for one write's answer before making the next (a claim
// durable before its tool runs) keeps that order by itself.
//
// Fallback: a stream that does not allow atomic publish (allow_atomic;
// `tollgate provision` turns it on) or a server older than 2.12 gets plain
// publishes only, and the committer says so once in its log (and again when
// that changes). Writes to a subject of no configured stream, writes with
// publish options, and writes a batch cannot carry (over the connection's
// max payload, with Nats-Expected-Last-Msg-Id, Nats-Expected-Last-Sequence,
// a message schedule, or batch headers of their own) are plain publishes.
package groupcommit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Headers of an atomic batch publish (nats-server's JSBatchId, JSBatchSeq,
// JSBatchCommit); nats.go has no batch publish API.
const (
	HeaderBatchID     = "Nats-Batch-Id"
	HeaderBatchSeq    = "Nats-Batch-Sequence"
	HeaderBatchCommit = "Nats-Batch-Commit"
)

// JSErrCodeAtomicPublishDisabled is nats-server's "atomic publish is
// disabled" (JSAtomicPublishDisabledErr): the stream does not allow it.
const JSErrCodeAtomicPublishDisabled jetstream.ErrorCode = 10174

// Defaults of Config.
const (
	DefaultMinBatch      = 12
	DefaultMaxBatch      = 1000
	DefaultMaxBatchBytes = 8 << 20
	DefaultAckTimeout    = 5 * time.Second
	// recheckAfter is how long a stream found without atomic publish is
	// written singly before the committer looks again (provisioning may
	// have turned it on meanwhile).
	recheckAfter = time.Minute
)

// Config configures a Committer.
type Config struct {
	// Streams are the streams whose writes are committed together, by
	// name and subjects (a subject of no stream here is published plainly).
	Streams []jetstream.StreamConfig
	// MinBatch is the fewest gathered writes sent as one atomic batch;
	// fewer go as plain publishes. Zero is DefaultMinBatch; 1 batches
	// any two or more writes.
	MinBatch int
	// MaxBatch bounds the writes of one batch (at most the server's
	// limit, 1,000); zero is DefaultMaxBatch.
	MaxBatch int
	// MaxBatchBytes bounds the payload and headers of one batch; zero is
	// DefaultMaxBatchBytes.
	MaxBatchBytes int
	// AckTimeout bounds the wait for a commit's answer; zero is
	// DefaultAckTimeout.
	AckTimeout time.Duration
	// Logger receives the fallback notices; nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics (tollgate_group_commit_*); nil
	// registers none.
	Registerer prometheus.Registerer
	// OnBatch, when set, is called with each atomic batch once every
	// write of it but the last has been sent and just before the last
	// (the commit message, on which the server stores the whole batch or
	// nothing), in the committing goroutine. It only observes: the commit
	// goes on the same way whatever it does, and it must return promptly
	// (the commit waits for it). For tests and fault injection
	// (internal/chaos kills the broker from it while a batch commits).
	OnBatch func(Batch)
}

// Batch describes an atomic batch being committed (Config.OnBatch).
type Batch struct {
	Stream string
	// ID is the batch's Nats-Batch-Id. The server stores it with each of
	// the batch's messages (with Nats-Batch-Sequence 1..n, the last also
	// with Nats-Batch-Commit), so a reader of the stream can tell which
	// stored messages one batch wrote.
	ID string
	// Subjects and MsgIDs are the writes' subjects and Nats-Msg-Id
	// headers ("" where none), in batch order: write i has
	// Nats-Batch-Sequence i+1.
	Subjects, MsgIDs []string
}

// Validate reports a configuration New would reject.
func (c Config) Validate() error {
	switch {
	case c.MinBatch < 0:
		return fmt.Errorf("groupcommit: min batch %d: want at least 1 (0: default)", c.MinBatch)
	case c.MaxBatch < 0 || c.MaxBatch > DefaultMaxBatch:
		return fmt.Errorf("groupcommit: max batch %d: want 1 to %d (0: default)", c.MaxBatch, DefaultMaxBatch)
	case c.MaxBatchBytes < 0:
		return fmt.Errorf("groupcommit: max batch bytes %d: want positive (0: default)", c.MaxBatchBytes)
	case c.AckTimeout < 0:
		return fmt.Errorf("groupcommit: ack timeout %v: want positive (0: default)", c.AckTimeout)
	}
	for _, s := range c.Streams {
		if s.Name == "" || len(s.Subjects) == 0 {
			return fmt.Errorf("groupcommit: stream %q: want a name and subjects", s.Name)
		}
	}
	return nil
}

// Committer is the group committer of one JetStream connection. It is safe
// for concurrent use; it starts no goroutine of its own outside a commit.
type Committer struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	cfg    Config
	log    *slog.Logger
	prefix string // the JetStream API prefix a KV subject may carry, with its dot; "" when default
	routes []route
	m      metrics
}

type route struct {
	pattern []string // subject tokens, with * and >
	s       *stream
}

// New returns a committer publishing through js.
func New(js jetstream.JetStream, cfg Config) (*Committer, error) {
	if js == nil {
		return nil, errors.New("groupcommit: JetStream is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MinBatch == 0 {
		cfg.MinBatch = DefaultMinBatch
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Committer{js: js, nc: js.Conn(), cfg: cfg, log: log, m: newMetrics(cfg.Registerer)}
	if p := js.Options().APIPrefix; p != "" && p != jetstream.DefaultAPIPrefix {
		c.prefix = strings.TrimSuffix(p, ".") + "."
	}
	for _, sc := range cfg.Streams {
		s := &stream{c: c, name: sc.Name}
		for _, subj := range sc.Subjects {
			c.routes = append(c.routes, route{pattern: strings.Split(subj, "."), s: s})
		}
	}
	return c, nil
}

// JetStream returns js (as given to New) with PublishMsg and Publish
// going through the committer when they have no publish options (set
// headers instead: jetstream.MsgIDHeader, ExpectedLastSubjSeqHeader,
// MsgTTLHeader); every other method is js's own.
func (c *Committer) JetStream() jetstream.JetStream { return &js{JetStream: c.js, c: c} }

type js struct {
	jetstream.JetStream
	c *Committer
}

func (j *js) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if len(opts) > 0 {
		return j.JetStream.PublishMsg(ctx, m, opts...)
	}
	return j.c.PublishMsg(ctx, m)
}

func (j *js) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

// PublishMsg publishes m as jetstream.JetStream.PublishMsg does (with no
// options: m's headers say everything), possibly in one atomic batch with
// other writes to its stream (see the package doc), and returns its own
// acknowledgement or error. m must not be changed until it returns. When
// ctx ends first it returns ctx's error; the write may still be stored.
func (c *Committer) PublishMsg(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	s := c.streamOf(m.Subject)
	if s == nil || c.solo(m) {
		c.m.plain.Inc()
		return c.js.PublishMsg(ctx, m)
	}
	w := &write{m: m, size: len(m.Data) + headerSize(m.Header) + len(m.Subject), done: make(chan result, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, w)
	lead := !s.busy
	s.busy = true
	s.mu.Unlock()
	if lead {
		// No commit in flight: this writer commits what waits (at least
		// its own write, alone at low load: a plain publish with its own
		// context), once; a goroutine takes over the writes that gather
		// meanwhile, so this writer's answer is not held up by others'.
		if s.commitNext(ctx, w) {
			go func() {
				for s.commitNext(context.Background(), nil) {
				}
			}()
		}
	}
	select {
	case r := <-w.done:
		return r.ack, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("publish %s: %w", m.Subject, ctx.Err())
	}
}

// solo reports whether m must go alone: a batch cannot carry it.
func (c *Committer) solo(m *nats.Msg) bool {
	if max := c.nc.MaxPayload(); max > 0 && int64(len(m.Data)+headerSize(m.Header)) > max {
		return true
	}
	for k := range m.Header {
		switch {
		case k == jetstream.ExpectedLastMsgIDHeader, k == jetstream.ExpectedLastSeqHeader,
			strings.HasPrefix(k, "Nats-Batch-"), strings.HasPrefix(k, "Nats-Schedule"):
			return true
		}
	}
	return false
}

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// streamOf returns the committer of the stream subject is stored in, or
// nil.
func (c *Committer) streamOf(subject string) *stream {
	subject = strings.TrimPrefix(subject, c.prefix)
	toks := strings.Split(subject, ".")
	for _, r := range c.routes {
		if matches(r.pattern, toks) {
			return r.s
		}
	}
	return nil
}

func matches(pattern, toks []string) bool {
	for i, p := range pattern {
		switch {
		case p == ">":
			return len(toks) > i
		case i >= len(toks):
			return false
		case p != "*" && p != toks[i]:
			return false
		}
	}
	return len(pattern) == len(toks)
}

type write struct {
	m    *nats.Msg
	size int
	done chan result
}

type result struct {
	ack *jetstream.PubAck
	err error
}

// Stats counts what a stream's committer did (Committer.Stats).
type Stats struct {
	Batches       int64 // atomic batches committed
	BatchedWrites int64 // writes inside them
	SingleWrites  int64 // writes published singly (alone, small gathers, fallbacks, retries)
	Refused       int64 // batches refused, whose writes were retried singly
	Failed        int64 // batches with no answer
}

// Stats returns the counts of stream name's committer (zero for a stream
// it does not commit).
func (c *Committer) Stats(name string) Stats {
	for _, r := range c.routes {
		if r.s.name == name {
			return Stats{r.s.batches.Load(), r.s.batched.Load(), r.s.single.Load(), r.s.refused.Load(), r.s.failed.Load()}
		}
	}
	return Stats{}
}

// stream is the committer of one stream.
type stream struct {
	c    *Committer
	name string

	batches, batched, single, refused, failed atomic.Int64

	mu    sync.Mutex
	queue []*write
	busy  bool // a commit is in flight (or about to be)

	// atomic: whether the stream takes atomic batches, as last checked
	// (checked at its first commit and recheckAfter after a "no").
	// Touched only by the committing goroutine (one at a time: busy).
	atomic  int // 0 unchecked, 1 yes, -1 no
	checked time.Time
	said    string // the fallback reason last logged
	// skip and backoff: after a refused batch (one bad write costs the
	// batch and a single retry of every write in it), the next skip
	// commits go singly; backoff doubles with each refusal in a row (up
	// to maxBackoff) and resets once a batch commits.
	skip, backoff int
}

// maxBackoff bounds the commits sent singly after refusals in a row.
const maxBackoff = 64

// commitNext takes the writes waiting (in order, up to the batch limits,
// never two of one subject), commits them, and reports whether more
// writes are waiting (then the caller must commit again: the stream stays
// busy). ctx and own are the calling writer's context and write, used for
// a lone write of its own.
func (s *stream) commitNext(ctx context.Context, own *write) bool {
	s.mu.Lock()
	n, bytes := 0, 0
	seen := make(map[string]bool, min(len(s.queue), s.c.cfg.MaxBatch))
	for _, w := range s.queue {
		if n == s.c.cfg.MaxBatch || (n > 0 && bytes+w.size > s.c.cfg.MaxBatchBytes) || seen[w.m.Subject] {
			break
		}
		seen[w.m.Subject] = true
		n++
		bytes += w.size
	}
	ws := make([]*write, n)
	copy(ws, s.queue)
	s.queue = s.queue[n:]
	if len(s.queue) == 0 {
		s.queue = nil
	}
	s.mu.Unlock()

	s.commit(ctx, own, ws)

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		s.busy = false
		return false
	}
	return true
}

func (s *stream) commit(ctx context.Context, own *write, ws []*write) {
	switch {
	case len(ws) == 1 && ws[0] == own:
		s.single.Add(1)
		s.c.m.single.WithLabelValues(s.name).Inc()
		ack, err := s.c.js.PublishMsg(ctx, own.m)
		own.done <- result{ack, err}
	case len(ws) < s.c.cfg.MinBatch || !s.atomicOK():
		s.singles(ws)
	case s.skip > 0:
		s.skip--
		s.singles(ws)
	default:
		s.batch(ws)
	}
}

// singles publishes ws one by one, pipelined, in order, and answers each.
func (s *stream) singles(ws []*write) {
	s.single.Add(int64(len(ws)))
	s.c.m.single.WithLabelValues(s.name).Add(float64(len(ws)))
	if len(ws) == 1 {
		ctx, cancel := context.WithTimeout(context.Background(), s.c.cfg.AckTimeout)
		ack, err := s.c.js.PublishMsg(ctx, ws[0].m)
		cancel()
		ws[0].done <- result{ack, err}
		return
	}
	futures := make([]jetstream.PubAckFuture, len(ws))
	for i, w := range ws {
		f, err := s.c.js.PublishMsgAsync(w.m)
		if err != nil {
			w.done <- result{nil, err}
			continue
		}
		futures[i] = f
	}
	t := time.NewTimer(s.c.cfg.AckTimeout)
	defer t.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			ws[i].done <- result{ack, nil}
		case err := <-f.Err():
			ws[i].done <- result{nil, err}
		case <-t.C:
			for j := i; j < len(futures); j++ {
				if futures[j] != nil {
					ws[j].done <- result{nil, fmt.Errorf("publish %s: %w", ws[j].m.Subject, jetstream.ErrAsyncPublishTimeout)}
				}
			}
			return
		}
	}
}

// batchAck is the answer to a batch's commit message.
type batchAck struct {
	jetstream.PubAck
	BatchID string              `json:"batch,omitempty"`
	Count   int                 `json:"count,omitempty"`
	Error   *jetstream.APIError `json:"error,omitempty"`
}

// batch commits ws as one atomic batch; on a refusal it sends them singly.
func (s *stream) batch(ws []*write) {
	id := strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix) // a nuid
	var resp *nats.Msg
	var err error
	for i, w := range ws {
		m := &nats.Msg{Subject: w.m.Subject, Data: w.m.Data, Header: make(nats.Header, len(w.m.Header)+3)}
		for k, v := range w.m.Header {
			m.Header[k] = v
		}
		m.Header.Set(HeaderBatchID, id)
		m.Header.Set(HeaderBatchSeq, strconv.Itoa(i+1))
		if i < len(ws)-1 {
			if err = s.c.nc.PublishMsg(m); err != nil {
				break
			}
			continue
		}
		if s.c.cfg.OnBatch != nil {
			s.c.cfg.OnBatch(describe(s.name, id, ws))
		}
		m.Header.Set(HeaderBatchCommit, "1")
		resp, err = s.c.nc.RequestMsg(m, s.c.cfg.AckTimeout)
	}
	var ack batchAck
	if err == nil {
		if jerr := json.Unmarshal(resp.Data, &ack); jerr != nil {
			err = fmt.Errorf("batch commit on %s: %w", s.name, jerr)
		}
	}
	switch {
	case err != nil && !errors.Is(err, nats.ErrMaxPayload) && !errors.Is(err, nats.ErrBadSubject):
		// No answer: the batch may be stored or not; each writer learns
		// it as it would of its own publish.
		s.failed.Add(1)
		s.c.m.batchErr.WithLabelValues(s.name).Inc()
		for _, w := range ws {
			w.done <- result{nil, fmt.Errorf("publish %s (in an atomic batch of %d): %w", w.m.Subject, len(ws), err)}
		}
	case err != nil || ack.Error != nil:
		// Refused: nothing of it is stored. Each write alone gets its own
		// answer.
		if ack.Error != nil && ack.Error.ErrorCode == JSErrCodeAtomicPublishDisabled {
			s.atomic, s.checked = -1, time.Now()
			s.say("stream does not allow atomic publish (allow_atomic): writes go singly; run `tollgate provision`")
		}
		s.refused.Add(1)
		s.c.m.refused.WithLabelValues(s.name).Inc()
		s.backoff = min(max(1, 2*s.backoff), maxBackoff)
		s.skip = s.backoff
		s.singles(ws)
	case ack.Count != len(ws) || ack.BatchID != id || ack.Sequence < uint64(len(ws)):
		// Not the answer to an atomic batch (a server that ignored the
		// headers): nothing here says what was stored.
		s.atomic, s.checked = -1, time.Now()
		s.say("server answered an atomic batch as a plain publish: writes go singly")
		for _, w := range ws {
			w.done <- result{nil, fmt.Errorf("publish %s: unexpected answer to an atomic batch: %s", w.m.Subject, resp.Data)}
		}
	default:
		s.backoff = 0
		s.batches.Add(1)
		s.batched.Add(int64(len(ws)))
		s.c.m.batches.WithLabelValues(s.name).Inc()
		s.c.m.batched.WithLabelValues(s.name).Add(float64(len(ws)))
		first := ack.Sequence - uint64(len(ws)) + 1
		for i, w := range ws {
			w.done <- result{&jetstream.PubAck{Stream: ack.Stream, Sequence: first + uint64(i), Domain: ack.Domain}, nil}
		}
	}
}

// describe is the Batch of ws, for Config.OnBatch.
func describe(stream, id string, ws []*write) Batch {
	b := Batch{Stream: stream, ID: id, Subjects: make([]string, len(ws)), MsgIDs: make([]string, len(ws))}
	for i, w := range ws {
		b.Subjects[i], b.MsgIDs[i] = w.m.Subject, w.m.Header.Get(jetstream.MsgIDHeader)
	}
	return b
}

// atomicOK reports whether the stream takes atomic batches: the server is
// 2.12 or newer and the stream allows atomic publish.
func (s *stream) atomicOK() bool {
	if s.atomic == 1 || (s.atomic == -1 && time.Since(s.checked) < recheckAfter) {
		return s.atomic == 1
	}
	s.checked = time.Now()
	s.atomic = -1
	if v := s.c.nc.ConnectedServerVersion(); !AtLeast(v, 2, 12) {
		s.say(fmt.Sprintf("server %s is older than 2.12 (no atomic batch publish): writes go singly", v))
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.cfg.AckTimeout)
	defer cancel()
	st, err := s.c.js.Stream(ctx, s.name)
	switch {
	case err != nil:
		s.say(fmt.Sprintf("stream lookup failed (%v): writes go singly", err))
		return false
	case !st.CachedInfo().Config.AllowAtomicPublish:
		s.say("stream does not allow atomic publish (allow_atomic): writes go singly; run `tollgate provision`")
		return false
	}
	s.atomic = 1
	if s.said != "" {
		s.c.log.Info("group commit: atomic batches on", "stream", s.name)
		s.said = ""
	}
	return true
}

// say logs a fallback reason once (again when it changes).
func (s *stream) say(why string) {
	if why == s.said {
		return
	}
	s.said = why
	s.c.log.Warn("group commit: "+why, "stream", s.name)
}

// AtLeast reports whether server version v (e.g. "2.12.1", "v2.15.2-RC.1")
// is at least major.minor; an unparsable version is not.
func AtLeast(v string, major, minor int) bool {
	v = strings.TrimPrefix(v, "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

type metrics struct {
	plain    prometheus.Counter
	single   *prometheus.CounterVec
	batches  *prometheus.CounterVec
	batched  *prometheus.CounterVec
	refused  *prometheus.CounterVec
	batchErr *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_group_commit_" + name, Help: help}, []string{"stream"})
	}
	m := metrics{
		plain:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_group_commit_passthrough_writes_total", Help: "Writes published plainly because no group-committed stream takes them or a batch cannot carry them."}),
		single:   vec("single_writes_total", "Writes a stream's committer published singly (alone, a small gather, a fallback, or the retry of a refused batch)."),
		batches:  vec("batches_total", "Atomic batches committed."),
		batched:  vec("batched_writes_total", "Writes committed inside atomic batches."),
		refused:  vec("refused_batches_total", "Atomic batches the server refused; their writes were sent again singly."),
		batchErr: vec("failed_batches_total", "Atomic batches that got no answer; each of their writers got the error."),
	}
	if reg != nil {
		reg.MustRegister(m.plain, m.single, m.batches, m.batched, m.refused, m.batchErr)
	}
	return m
}
