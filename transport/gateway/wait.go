package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TurnView is a turn as the API shows it: its batch, each call's
// disposition, approval (with who decided it) and result.
type TurnView struct {
	TurnID    string             `json:"turn_id"`
	SessionID string             `json:"session_id"`
	Transport string             `json:"transport"`
	State     schemas.BatchState `json:"state"`
	Terminal  bool               `json:"terminal"`
	Code      schemas.Code       `json:"code,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	Text      string             `json:"text,omitempty"`
	Calls     []CallView         `json:"calls"`
	CreatedAt time.Time          `json:"created_at"`
	UpdatedAt time.Time          `json:"updated_at"`

	batch *schemas.BatchRecord
}

// Dispositions of a call.
const (
	DispositionQueued  = "queued"  // not evaluated yet
	DispositionPending = "pending" // waiting for a decision on its approval
	DispositionRan     = "ran"     // the tool ran (result ok or error)
	// Otherwise the disposition is the result's status: denied, failed,
	// expired, abandoned, needs_attention.
)

// CallView is one call of a turn.
type CallView struct {
	CallID      string        `json:"call_id"`
	Index       int           `json:"index"`
	Tool        string        `json:"tool"`
	Args        string        `json:"args"`
	ArgsDigest  string        `json:"args_digest"`
	Disposition string        `json:"disposition"`
	ApprovalID  string        `json:"approval_id,omitempty"`
	Approval    *ApprovalView `json:"approval,omitempty"`
	Result      *ResultView   `json:"result,omitempty"`
}

// ResultView is a call's result.
type ResultView struct {
	Status     schemas.ResultStatus `json:"status"`
	Output     string               `json:"output,omitempty"`
	Code       schemas.Code         `json:"code,omitempty"`
	Reason     string               `json:"reason,omitempty"`
	FinishedAt time.Time            `json:"finished_at"`
}

// ApprovalView is an approval as the API shows it; ArgsDigest is what a
// decision must carry.
type ApprovalView struct {
	ApprovalID string `json:"approval_id"`
	TurnID     string `json:"turn_id"`
	CallID     string `json:"call_id"`
	SessionID  string `json:"session_id"`
	Transport  string `json:"transport"`
	Requester  string `json:"requester"`
	Tool       string `json:"tool"`
	Args       string `json:"args"`
	ArgsDigest string `json:"args_digest"`
	// ArgsFlagged says that Args holds a character reveal escapes (a
	// bidi control, a zero-width or other invisible or control
	// character); ArgsVisible is Args as a person is shown it
	// (reveal.JSON: the same value, each such character a \u escape).
	ArgsFlagged bool                   `json:"args_flagged"`
	ArgsVisible string                 `json:"args_visible"`
	Options     []string               `json:"options"`
	Status      schemas.ApprovalStatus `json:"status"`
	RequestedAt time.Time              `json:"requested_at"`
	ExpiresAt   *time.Time             `json:"expires_at,omitempty"`
	Quorum      int                    `json:"quorum"`
	Decision    *DecisionView          `json:"decision,omitempty"`
	Votes       []DecisionView         `json:"votes"`
	// Preview is what the call would change, as of Preview.At (advisory:
	// a decision binds ArgsDigest, never the preview); nil when the tool
	// offers none. Whole only for a key that may decide (disclosedTo).
	Preview *PreviewView `json:"preview,omitempty"`

	preview *schemas.ApprovalPreview // the record's, for disclosedTo
}

// disclosedTo is v as key may see it (docs/security.md rule 17): with the
// whole preview for a key with scope decide (the approval is of the key's
// transport: every view is), with the preview summary-only
// (schemas.ApprovalPreview.SummaryOnly) for any other key, the one that
// asked included. v itself is not changed.
func (v *ApprovalView) disclosedTo(key *Key) *ApprovalView {
	if v == nil || v.Preview == nil || key.Allows(ScopeDecide) {
		return v
	}
	c := *v
	c.Preview = previewView(v.preview.SummaryOnly())
	return &c
}

// callsFor is calls as key may see them (ApprovalView.disclosedTo); calls
// itself is not changed.
func callsFor(calls []CallView, key *Key) []CallView {
	out, cloned := calls, false
	for i := range calls {
		if a := calls[i].Approval.disclosedTo(key); a != calls[i].Approval {
			if !cloned {
				out, cloned = slices.Clone(calls), true
			}
			out[i].Approval = a
		}
	}
	return out
}

// PreviewView is an approval's preview (schemas.ApprovalPreview) with the
// text as a person is shown it (reveal.String), its summary and its
// counts. A summary-only view (Redacted: for a key that may not decide)
// has no text and no reason.
type PreviewView struct {
	Status      string    `json:"status"`
	Kind        string    `json:"kind,omitempty"`
	Text        string    `json:"text"`
	TextVisible string    `json:"text_visible"`
	Flagged     bool      `json:"flagged"`
	Reason      string    `json:"reason,omitempty"`
	Truncated   bool      `json:"truncated,omitempty"`
	Summary     string    `json:"summary"`
	Added       int       `json:"added,omitempty"`
	Removed     int       `json:"removed,omitempty"`
	Lines       int       `json:"lines,omitempty"`
	Redacted    bool      `json:"redacted,omitempty"`
	At          time.Time `json:"at"`
}

// previewView is the view of p, nil when there is none to show.
func previewView(p *schemas.ApprovalPreview) *PreviewView {
	if p == nil || p.Status == "" || p.Status == schemas.PreviewUnsupported {
		return nil
	}
	v := &PreviewView{Status: p.Status, Kind: p.Kind, Text: p.Text, Truncated: p.Truncated, Redacted: p.Redacted, At: p.At}
	v.Added, v.Removed, v.Lines = p.Counts()
	var f1, f2, f3 bool
	v.TextVisible, f1 = reveal.String(p.Text)
	v.Reason, f2 = reveal.String(p.Reason)
	v.Summary, f3 = reveal.String(p.Summary())
	v.Flagged = f1 || f2 || f3
	return v
}

// DecisionView is who decided (or voted) and how.
type DecisionView struct {
	DecisionID string    `json:"decision_id"`
	Principal  string    `json:"principal"`
	Option     string    `json:"option"`
	DecidedAt  time.Time `json:"decided_at"`
	// Note is the decider's note (a deny reason, an approve comment), as
	// sent; omitted when there was none.
	Note string `json:"note,omitempty"`
}

func resultView(r *schemas.ToolResult) *ResultView {
	if r == nil {
		return nil
	}
	return &ResultView{Status: r.Status, Output: r.Output, Code: r.Code, Reason: r.Reason, FinishedAt: r.FinishedAt}
}

func decisionView(d schemas.DecisionInfo) DecisionView {
	return DecisionView{DecisionID: d.DecisionID, Principal: d.Principal, Option: d.Option, DecidedAt: d.DecidedAt, Note: d.Note}
}

func approvalView(a *schemas.ApprovalRecord) *ApprovalView {
	v := &ApprovalView{
		ApprovalID: a.ApprovalID, TurnID: a.TurnID, CallID: a.CallID, SessionID: a.SessionID,
		Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest, Options: a.Options, Status: a.Status,
		RequestedAt: a.RequestedAt, Quorum: max(a.Quorum, 1), Votes: []DecisionView{},
		Preview: previewView(a.Preview), preview: a.Preview,
	}
	v.ArgsVisible, v.ArgsFlagged = reveal.JSON(a.Args)
	if a.Context != nil {
		v.Transport, v.Requester = a.Context.Transport, a.Context.Requester.Principal
	}
	if !a.ExpiresAt.IsZero() {
		t := a.ExpiresAt
		v.ExpiresAt = &t
	}
	if a.Decision != nil {
		d := decisionView(*a.Decision)
		v.Decision = &d
	}
	for _, vote := range a.Votes {
		v.Votes = append(v.Votes, decisionView(vote))
	}
	return v
}

// view builds the TurnView of b, reading the approvals of its calls.
func (s *Server) view(ctx context.Context, b *schemas.BatchRecord) (*TurnView, error) {
	v := outline(b)
	for i := range v.Calls {
		cv := &v.Calls[i]
		if cv.ApprovalID == "" {
			continue
		}
		// A decided record changes no more: one the gateway keeps (read
		// before, or rebuilt from the decided event that answered a
		// decision made through it) is served as it is. A pending one is
		// read, since it may have been decided since.
		s.mu.Lock()
		a, ok := s.approvals.get(cv.ApprovalID)
		s.mu.Unlock()
		if ok && a.Status != schemas.ApprovalPending {
			cv.Approval = approvalView(a)
			continue
		}
		a, _, err := s.store.Approvals.Get(ctx, cv.ApprovalID)
		switch {
		case err == nil:
			cv.Approval = approvalView(a)
			s.mu.Lock()
			s.approvals.set(a.ApprovalID, a, recentWrites)
			s.mu.Unlock()
		case !errors.Is(err, store.ErrNotFound) && schemas.CodeOf(err) == "":
			return nil, unavailable(err)
		}
	}
	return v, nil
}

// outline is the TurnView of b without its approval records: everything
// the batch record alone says (states, dispositions, results), which is
// what the waits judge.
func outline(b *schemas.BatchRecord) *TurnView {
	v := &TurnView{
		TurnID: b.TurnID, SessionID: b.SessionID, State: b.State, Terminal: b.State.Terminal(),
		Code: b.Code, Reason: b.Reason, Text: b.Text, Calls: []CallView{},
		CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt, batch: b,
	}
	if b.Context != nil {
		v.Transport = b.Context.Transport
	}
	for i, c := range b.Calls {
		cv := CallView{CallID: c.CallID, Index: c.Index, Tool: c.Tool, Args: c.Args, ArgsDigest: c.ArgsDigest, Disposition: DispositionQueued}
		if i < len(b.Approvals) && b.Approvals[i] != "" {
			cv.ApprovalID = b.Approvals[i]
			cv.Disposition = DispositionPending
		}
		if i < len(b.Results) && b.Results[i] != nil {
			cv.Result = resultView(b.Results[i])
			switch b.Results[i].Status {
			case schemas.ResultOK, schemas.ResultError:
				cv.Disposition = DispositionRan
			default:
				cv.Disposition = string(b.Results[i].Status)
			}
		}
		v.Calls = append(v.Calls, cv)
	}
	return v
}

// turn reads turnID's view now; errUnknown if it has no batch.
func (s *Server) turn(ctx context.Context, turnID string) (*TurnView, error) {
	if !schemas.ValidKey(turnID) {
		return nil, errUnknown
	}
	b, _, err := s.store.Batches.Get(ctx, turnID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errUnknown
	}
	if err != nil {
		return nil, unavailable(err)
	}
	return s.view(ctx, b)
}

// watchTurn follows turnID's batch record until until(outline) holds, and
// returns the record's full view (with its approvals, read once, then).
// When ctx ends first it returns the latest full view (nil if the turn has
// no batch yet) and ctx's error.
//
// It reads the record, then again each time the batches feed (see
// batchFeed) reports a write of the turn's batch (an append to its turn
// log, or for an earlier version's batch a write to its key in the
// bucket), and at least every feedFallback in case a report was missed (a
// reconnect): one feed serves every waiting request, instead of a watch
// (an ordered consumer created and deleted on the server) per request,
// which cost the gateway about half its turn rate under load (make bench,
// gateway phase).
func (s *Server) watchTurn(ctx context.Context, turnID string, until func(*TurnView) bool) (*TurnView, error) {
	if !schemas.ValidKey(turnID) {
		return nil, errUnknown
	}
	tw, err := s.follow(turnID)
	if err != nil {
		return nil, err
	}
	defer tw.stop()
	return tw.until(ctx, until, true)
}

// turnWatch is a request's registration with the batches feed for one
// turn: made by follow before the writes it must not miss, used by until,
// ended by stop.
type turnWatch struct {
	s      *Server
	turnID string
	w      *feedWaiter
	latest []byte // the feed's latest write of the turn when the watch was made; nil if none is kept
	stop   func()
}

// follow registers a watch of turnID's batch record: every write to it
// from now on is reported to the watch.
func (s *Server) follow(turnID string) (*turnWatch, error) {
	w, latest, stop, err := s.feed.wait(s.cfg.JS.Conn(), s.store.Batches.KV.Bucket(), turnID)
	if err != nil {
		return nil, unavailable(err)
	}
	return &turnWatch{s: s, turnID: turnID, w: w, latest: latest, stop: stop}, nil
}

// until is watchTurn on a watch made earlier. Its first look is the write
// the feed kept for the turn when the watch was made, if it kept one (no
// write the feed hears after it is missed, so waiting from it is as good
// as waiting from a read); otherwise a read, unless readFirst is false:
// then the first look is the feed's first report (or the fallback read),
// for a caller that knows the record did not exist when the watch was
// made, such as a submit that has just published its turn's first
// message, so a read could only find nothing.
func (tw *turnWatch) until(ctx context.Context, until func(*TurnView) bool, readFirst bool) (*TurnView, error) {
	s := tw.s
	tick := time.NewTicker(s.feed.every())
	defer tick.Stop()
	var b, last *schemas.BatchRecord // the record judged now, and the last one seen
	// full is the view of last with its approvals, for the caller; after
	// ctx has ended, read on a short context of its own.
	full := func(err error) (*TurnView, error) {
		if last == nil {
			return nil, err
		}
		rctx := ctx
		if ctx.Err() != nil {
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
		}
		v, verr := s.view(rctx, last)
		if verr != nil {
			return nil, verr
		}
		return v, err
	}
	read := readFirst // the first look, and each fallback, reads the record
	if tw.latest != nil {
		if got, err := schemas.DecodeBatch(tw.latest); err == nil {
			b, read = got, false
		}
	}
	for {
		if read {
			got, _, err := s.store.Batches.Get(ctx, tw.turnID)
			switch {
			case err == nil:
				b = got
			case errors.Is(err, store.ErrNotFound), schemas.Permanent(err):
				b = nil // not written yet, or undecodable: wait for the next write
			case ctx.Err() != nil:
				return full(ctx.Err())
			default:
				return full(unavailable(err))
			}
		}
		if b != nil && (last == nil || !b.UpdatedAt.Before(last.UpdatedAt)) {
			last = b
			if until(outline(b)) {
				return full(nil)
			}
		}
		select {
		case <-ctx.Done():
			return full(ctx.Err())
		case <-tw.w.ch:
			// The write as published: a subscriber can hear of a write
			// before the stream answers reads with it, so the body is
			// used rather than a read. A report older than the record
			// already judged (it was in flight during the read) is passed
			// over.
			read = false
			var err error
			if b, err = schemas.DecodeBatch(tw.w.take()); err != nil {
				b = nil
			}
		case <-tick.C:
			read = true
		}
	}
}

// feedFallback is how often a waiting request reads its turn again even
// if the feed reported no write.
const feedFallback = 2 * time.Second

// batchFeed reports the writes of batch records to the requests waiting
// on them, from core NATS subscriptions made on first use: one on the turn
// logs' subjects (every batch written now: each write is an append to its
// turn's log, tollgate.turnlog.<partition>.<turn>.<event>, carrying the
// whole record) and one on the batches bucket's (an earlier version's
// batches, which finish there: store.Batches). It also keeps the latest
// write of the recentWrites turns written last, so that a request that
// starts waiting on a turn written a moment ago (the long poll after a
// decision) starts from that write instead of a read.
//
// A turn's batch is kept in one place for its whole life, so the two
// subscriptions (each with its own delivery goroutine) never race for one
// turn, except while a tool moves a batch between them; a request that
// starts from a write kept then reads again within feedFallback.
type batchFeed struct {
	once sync.Once
	err  error
	subs []*nats.Subscription
	// fallback replaces feedFallback when set (tests: a wait that only
	// the feed can end).
	fallback time.Duration

	mu      sync.Mutex
	waiters map[string]map[*feedWaiter]struct{} // by turn id
	latest  recent[[]byte]                      // by turn id
}

// every is how often a waiting request reads its turn again.
func (f *batchFeed) every() time.Duration {
	if f.fallback > 0 {
		return f.fallback
	}
	return feedFallback
}

// recentWrites is how many turns' latest writes the feed keeps: at a few
// hundred turns a second, the last several seconds, for about 1.5 KiB
// each.
const recentWrites = 4096

// feedWaiter is one waiting request: ch signals that latest holds a write
// not yet taken.
type feedWaiter struct {
	ch     chan struct{}
	mu     sync.Mutex
	latest []byte
}

// take returns the latest write reported.
func (w *feedWaiter) take() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest
}

// wait registers a waiter for writes of turn key's batch (bucket is the
// batches bucket) and returns it with the latest write of key the feed
// keeps (nil if none) and the function that unregisters it. The
// subscriptions are in place before wait returns, and the kept write and
// the registration are taken together, so every write after the kept one
// (or, with none kept, after wait) is reported.
func (f *batchFeed) wait(nc *nats.Conn, bucket, key string) (*feedWaiter, []byte, func(), error) {
	f.once.Do(func() { f.err = f.subscribe(nc, bucket) })
	if f.err != nil {
		return nil, nil, nil, fmt.Errorf("gateway: follow the batch records: %w", f.err)
	}
	w := &feedWaiter{ch: make(chan struct{}, 1)}
	f.mu.Lock()
	if f.waiters == nil {
		f.waiters = map[string]map[*feedWaiter]struct{}{}
	}
	if f.waiters[key] == nil {
		f.waiters[key] = map[*feedWaiter]struct{}{}
	}
	f.waiters[key][w] = struct{}{}
	latest, _ := f.latest.get(key)
	f.mu.Unlock()
	return w, latest, func() {
		f.mu.Lock()
		delete(f.waiters[key], w)
		if len(f.waiters[key]) == 0 {
			delete(f.waiters, key)
		}
		f.mu.Unlock()
	}, nil
}

// subscribe makes the feed's subscriptions, the turn logs' and bucket's,
// and waits until the server has them.
func (f *batchFeed) subscribe(nc *nats.Conn, bucket string) error {
	sub := func(subject string, fn nats.MsgHandler) error {
		s, err := nc.Subscribe(subject, fn)
		if err != nil {
			return err
		}
		f.subs = append(f.subs, s)
		return s.SetPendingLimits(-1, -1) // never drop a report: a waiter would wait for the fallback
	}
	// Every message on a turn log is an append: the turn's batch as
	// written. A purge of a turn's log (a tool moving its batch) leaves no
	// message; the kept write is then replaced by the batch's next write
	// in its new place, or dropped with the oldest.
	if err := sub(topology.SubjectTurnLogPrefix+">", func(m *nats.Msg) {
		if _, turn, _, ok := topology.ParseTurnLogSubject(m.Subject); ok {
			f.wake(turn, m.Data)
		}
	}); err != nil {
		return err
	}
	prefix := "$KV." + bucket + "."
	if err := sub(prefix+">", func(m *nats.Msg) {
		key := strings.TrimPrefix(m.Subject, prefix)
		if m.Header.Get(kvOperation) == "" { // a put, not a delete or purge marker
			f.wake(key, m.Data)
		} else {
			f.forget(key)
		}
	}); err != nil {
		return err
	}
	return nc.Flush() // the server has the subscriptions
}

// kvOperation is the header JetStream KV marks deletes and purges with.
const kvOperation = "KV-Operation"

func (f *batchFeed) wake(key string, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latest.set(key, data, recentWrites)
	for w := range f.waiters[key] {
		w.mu.Lock()
		w.latest = data
		w.mu.Unlock()
		select {
		case w.ch <- struct{}{}:
		default: // a wake is already pending; it takes the latest
		}
	}
}

// forget drops the write kept for key, deleted or purged.
func (f *batchFeed) forget(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latest.drop(key)
}

// recent keeps the values of the keys set last, up to a number; the
// caller serialises its use.
type recent[V any] struct {
	vals map[string]V
	ring []string // the keys in the order first set; the oldest at next
	next int
}

// set makes v the value of key; when n keys are kept, it makes room by
// dropping the key first set longest ago.
func (r *recent[V]) set(key string, v V, n int) {
	if r.vals == nil {
		r.vals, r.ring = map[string]V{}, make([]string, n)
	}
	if _, ok := r.vals[key]; !ok {
		if old := r.ring[r.next]; old != "" {
			delete(r.vals, old)
		}
		r.ring[r.next] = key
		r.next = (r.next + 1) % len(r.ring)
	}
	r.vals[key] = v
}

func (r *recent[V]) get(key string) (V, bool) {
	v, ok := r.vals[key]
	return v, ok
}

// drop forgets key. Its slot in the ring is reused in turn; should key be
// set again before that, the reuse drops it early, which only costs a read.
func (r *recent[V]) drop(key string) { delete(r.vals, key) }

// eventFeed hands the events published on some subjects to the requests
// waiting on them, from one core NATS subscription per subject pattern,
// made on first use: a decision's answer (its rejection, or its
// approval's decided event) reaches the request that published it without
// a subscription, an unsubscription and a flush per request.
type eventFeed struct {
	once sync.Once
	err  error

	mu      sync.Mutex
	waiters map[string]map[chan *nats.Msg]struct{} // by subject
}

// eventFeedBuffer is how many events a waiter holds before the feed drops
// the next ones for it; a waiter's subjects carry the events of one
// approval or turn, far fewer than this.
const eventFeedBuffer = 64

// wait registers a waiter for the events on subjects (each one a literal
// subject under one of patterns) and returns its channel with the
// function that unregisters it. The subscriptions are in place before
// wait returns, so an event published after it is handed over.
func (f *eventFeed) wait(nc *nats.Conn, patterns []string, subjects ...string) (<-chan *nats.Msg, func(), error) {
	f.once.Do(func() {
		for _, p := range patterns {
			var sub *nats.Subscription
			if sub, f.err = nc.Subscribe(p, f.hand); f.err != nil {
				return
			}
			if f.err = sub.SetPendingLimits(-1, -1); f.err != nil {
				return
			}
		}
		f.err = nc.Flush() // the server has the subscriptions
	})
	if f.err != nil {
		return nil, nil, fmt.Errorf("gateway: follow the decision events: %w", f.err)
	}
	ch := make(chan *nats.Msg, eventFeedBuffer)
	f.mu.Lock()
	if f.waiters == nil {
		f.waiters = map[string]map[chan *nats.Msg]struct{}{}
	}
	for _, subj := range subjects {
		if f.waiters[subj] == nil {
			f.waiters[subj] = map[chan *nats.Msg]struct{}{}
		}
		f.waiters[subj][ch] = struct{}{}
	}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		for _, subj := range subjects {
			delete(f.waiters[subj], ch)
			if len(f.waiters[subj]) == 0 {
				delete(f.waiters, subj)
			}
		}
		f.mu.Unlock()
	}, nil
}

func (f *eventFeed) hand(m *nats.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.waiters[m.Subject] {
		select {
		case ch <- m:
		default: // full: the waiter answers at its deadline with what it knows
		}
	}
}

// waitCall waits until call callID (CallID form) has a result in its
// turn's batch, and returns it. When ctx ends first it returns ctx's
// error; a call id not of CallID's form is errUnknown.
func (s *Server) waitCall(ctx context.Context, callID string) (*schemas.ToolResult, error) {
	turnID := schemas.TurnIDOfCall(callID)
	if turnID == "" {
		return nil, errUnknown
	}
	idx, err := strconv.Atoi(callID[len(turnID)+1:])
	if err != nil {
		return nil, errUnknown
	}
	v, err := s.watchTurn(ctx, turnID, func(v *TurnView) bool {
		return idx >= len(v.batch.Calls) || (idx < len(v.batch.Results) && v.batch.Results[idx] != nil)
	})
	if err != nil {
		return nil, err
	}
	if idx >= len(v.batch.Calls) {
		return nil, fmt.Errorf("gateway: turn %s has no call %d: %w", turnID, idx, errUnknown)
	}
	return v.batch.Results[idx], nil
}

// notFound is the API's answer for errUnknown.
func notFound(code schemas.Code, what string) error {
	return errorf(http.StatusNotFound, code, "no %s for this API key's transport", what)
}
