package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/pipeline/store"
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
	ApprovalID  string                 `json:"approval_id"`
	TurnID      string                 `json:"turn_id"`
	CallID      string                 `json:"call_id"`
	SessionID   string                 `json:"session_id"`
	Transport   string                 `json:"transport"`
	Requester   string                 `json:"requester"`
	Tool        string                 `json:"tool"`
	Args        string                 `json:"args"`
	ArgsDigest  string                 `json:"args_digest"`
	Options     []string               `json:"options"`
	Status      schemas.ApprovalStatus `json:"status"`
	RequestedAt time.Time              `json:"requested_at"`
	ExpiresAt   *time.Time             `json:"expires_at,omitempty"`
	Quorum      int                    `json:"quorum"`
	Decision    *DecisionView          `json:"decision,omitempty"`
	Votes       []DecisionView         `json:"votes"`
}

// DecisionView is who decided (or voted) and how.
type DecisionView struct {
	DecisionID string    `json:"decision_id"`
	Principal  string    `json:"principal"`
	Option     string    `json:"option"`
	DecidedAt  time.Time `json:"decided_at"`
}

func resultView(r *schemas.ToolResult) *ResultView {
	if r == nil {
		return nil
	}
	return &ResultView{Status: r.Status, Output: r.Output, Code: r.Code, Reason: r.Reason, FinishedAt: r.FinishedAt}
}

func decisionView(d schemas.DecisionInfo) DecisionView {
	return DecisionView{DecisionID: d.DecisionID, Principal: d.Principal, Option: d.Option, DecidedAt: d.DecidedAt}
}

func approvalView(a *schemas.ApprovalRecord) *ApprovalView {
	v := &ApprovalView{
		ApprovalID: a.ApprovalID, TurnID: a.TurnID, CallID: a.CallID, SessionID: a.SessionID,
		Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest, Options: a.Options, Status: a.Status,
		RequestedAt: a.RequestedAt, Quorum: max(a.Quorum, 1), Votes: []DecisionView{},
	}
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
		a, _, err := s.store.Approvals.Get(ctx, cv.ApprovalID)
		switch {
		case err == nil:
			cv.Approval = approvalView(a)
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
// It reads the record, then again each time the batches feed (see feed)
// reports a write to the turn's key, and at least every feedFallback in
// case a report was missed (a reconnect): one subscription serves every
// waiting request, instead of a KV watch (an ordered consumer created and
// deleted on the server) per request, which cost the gateway about half
// its turn rate under load (make bench, gateway phase).
func (s *Server) watchTurn(ctx context.Context, turnID string, until func(*TurnView) bool) (*TurnView, error) {
	if !schemas.ValidKey(turnID) {
		return nil, errUnknown
	}
	w, stop, err := s.feed.wait(s.cfg.JS.Conn(), s.store.Batches.KV.Bucket(), turnID)
	if err != nil {
		return nil, unavailable(err)
	}
	defer stop()
	tick := time.NewTicker(feedFallback)
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
	read := true // the first look, and each fallback, reads the record
	for {
		if read {
			got, _, err := s.store.Batches.Get(ctx, turnID)
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
		case <-w.ch:
			// The write as published: a subscriber can hear of a write
			// before the stream answers reads with it, so the body is
			// used rather than a read. A report older than the record
			// already judged (it was in flight during the read) is passed
			// over.
			read = false
			if b, err = s.store.Batches.DecodeValue(w.take()); err != nil {
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

// batchFeed reports writes to the batches bucket to the requests waiting on
// them, from one core NATS subscription on the bucket's subjects, made on
// first use.
type batchFeed struct {
	once sync.Once
	err  error
	sub  *nats.Subscription

	mu      sync.Mutex
	waiters map[string]map[*feedWaiter]struct{} // by turn id
}

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

// wait registers a waiter for writes to key and returns it with the
// function that unregisters it. The subscription is in place before wait
// returns, so a write after it is reported.
func (f *batchFeed) wait(nc *nats.Conn, bucket, key string) (*feedWaiter, func(), error) {
	f.once.Do(func() {
		prefix := "$KV." + bucket + "."
		f.sub, f.err = nc.Subscribe(prefix+">", func(m *nats.Msg) {
			if m.Header.Get(kvOperation) == "" { // a put, not a delete or purge marker
				f.wake(strings.TrimPrefix(m.Subject, prefix), m.Data)
			}
		})
		if f.err == nil {
			f.err = f.sub.SetPendingLimits(-1, -1)
		}
		if f.err == nil {
			f.err = nc.Flush() // the server has the subscription
		}
	})
	if f.err != nil {
		return nil, nil, fmt.Errorf("gateway: follow the batches bucket: %w", f.err)
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
	f.mu.Unlock()
	return w, func() {
		f.mu.Lock()
		delete(f.waiters[key], w)
		if len(f.waiters[key]) == 0 {
			delete(f.waiters, key)
		}
		f.mu.Unlock()
	}, nil
}

// kvOperation is the header JetStream KV marks deletes and purges with.
const kvOperation = "KV-Operation"

func (f *batchFeed) wake(key string, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
