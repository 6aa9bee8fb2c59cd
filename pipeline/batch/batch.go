// Package batch holds the batch logic that the executor and the redriver
// share: running a call at most once (execution claims), ending a batch in
// exactly one terminal state, publishing its outcome, and the session
// order that runs a session's batches one at a time in arrival order.
//
// Every function here is idempotent: called again after a crash or a
// redelivery, it converges to the same records and publishes with the same
// message ids.
//
// The package is in four parts: execution claims (claims.go: Execute),
// the end of a batch (end.go), the session order (order.go: Place,
// ItsTurn, and the end of a batch announcing the next turn) and an
// earlier version's session record (session.go: Acquire, Release,
// Announce).
//
// # Ending a batch
//
// Five functions end a batch. None changes a batch that is already
// terminal, and exactly one call makes a batch terminal. "Outcome" says
// whether the function announces the turn's TurnOutcome (built by Outcome,
// once per turn). The write that ends a batch in its turn log keeps the
// outcome (the log's outcome event: End writes it, and nothing is
// published); for a batch kept in tollgate_batches, or one an earlier
// version ended without it, Finish publishes it on
// tollgate.event.turn.outcome.<turn> (a repeat finds it stored or is
// deduplicated by its message id). "session" says whether it announces
// the session's next turn (order.go; for an earlier version's batch, the
// session record's release).
//
//	function      called by                        from state    writes                              outcome  session
//	End           redriver, failing a batch        not terminal  state, results, code; a failed      no       kept
//	              closed (its failed redrive                     batch's calls without a result
//	              outcome goes out before Finish)                get a failed result with the code
//	Finish        executor, redriver, on a batch   terminal      a failed batch's pending            yes      released
//	              found terminal; after End        (else error)  approvals -> abandoned (announced)
//	Conclude      executor, failing a batch        any           End, then Finish                    yes      released
//	              closed
//	ConcludeFrom  executor, redriver, when every   any           as Conclude, compare-and-setting    yes      released
//	              call has a result                              from the records the caller holds
//	Abort         executor, redriver, giving up    any; absent   as Conclude, failed with the        yes      released
//	              on a message (runner's           or unreadable dead letter's code
//	              OnDeadLetter hook)               batch: no-op
package batch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// Config wires an Engine.
type Config struct {
	JS     jetstream.JetStream
	Store  *store.Store
	Tools  *tools.Catalog
	Keys   *seal.KeyRing // verifies the seal of every context a call runs under
	Worker string        // recorded on claims, e.g. "executor@host:pid"
	Logger *slog.Logger

	// ClaimLease is how long a claim without a result is presumed to belong
	// to a live worker. After it, the call's fate is unknown and it is
	// reported needs_attention rather than run again. Default 2m.
	ClaimLease time.Duration
	// ToolTimeout bounds one tool run. Default 1m; must be below ClaimLease.
	ToolTimeout time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
	// Registerer receives the engine's metrics (turns ended, call results);
	// nil registers none.
	Registerer prometheus.Registerer
}

// Validate reports missing wiring.
func (c *Config) Validate() error {
	switch {
	case c.JS == nil || c.Store == nil || c.Tools == nil || c.Keys == nil || c.Logger == nil:
		return errors.New("batch: JS, Store, Tools, Keys and Logger are required")
	case c.Worker == "":
		return errors.New("batch: Worker is required")
	}
	if c.ClaimLease == 0 {
		c.ClaimLease = 2 * time.Minute
	}
	if c.ToolTimeout == 0 {
		c.ToolTimeout = time.Minute
	}
	if c.ToolTimeout >= c.ClaimLease {
		return fmt.Errorf("batch: ToolTimeout %v must be below ClaimLease %v", c.ToolTimeout, c.ClaimLease)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Engine runs calls and ends batches.
type Engine struct {
	cfg Config

	mu     sync.Mutex
	events jetstream.Stream // handle on the events stream, bound on first use
	orders *turnorder.Lazy  // the sessions' orders, made on first use (Orders)

	// worker is cfg.Worker plus a random suffix, unique to this engine, so
	// a claim can be recognised as its own; started holds the call ids
	// whose tool this engine started, with when (see judgeClaim; entries
	// older than the claim lease are dropped by markStarted, as the rule
	// no longer asks about them); inflight the call ids
	// an Execute of this engine is claiming or running right now, so that
	// two goroutines of one engine (the executor and the redriver share
	// one in a single process) never both take its own claim for theirs.
	worker   string
	started  sync.Map // call id -> time.Time
	starts   atomic.Uint64
	inflight sync.Map

	// ended counts batches this engine made terminal, by state; results
	// their calls' results, by status and code. Each batch is counted
	// once, by the engine whose compare-and-set ended it.
	ended   *prometheus.CounterVec
	results *prometheus.CounterVec
	// legacyRuns counts the runs of version 1 batches (claims in
	// tollgate_claims): the compatibility path of schemas.DecodeBatch.
	legacyRuns prometheus.Counter

	// recent holds the turns this engine made terminal lately, so that
	// Acquire need not read whether a session's holder has ended when this
	// engine ended it (a terminal batch never changes again).
	recent endedTurns

	// records is the view of the session records' keys (records.go):
	// current only while a stage follows it (FollowRecords).
	records *recordView

	// beforeQueue, if set, is called by Acquire after it read the session
	// and its holder and before the write that queues a turn (tests: the
	// holder's end in between).
	beforeQueue atomic.Pointer[func(turn string)]
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	nonce := make([]byte, 4)
	rand.Read(nonce)
	e := &Engine{
		cfg: cfg, worker: cfg.Worker + "#" + hex.EncodeToString(nonce), recent: newEndedTurns(recentEnded), orders: turnorder.NewLazy(cfg.JS),
		records: &recordView{kv: cfg.Store.Sessions.KV, log: cfg.Logger},
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_turns_ended_total",
			Help: "Turns made terminal, by batch state (completed, failed).",
		}, []string{"state"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_call_results_total",
			Help: "Results of the calls of turns made terminal, by status (ok, error, denied, failed, needs_attention) and code.",
		}, []string{"status", "code"}),
	}
	if err := metrics.Register(cfg.Registerer, &e.ended); err != nil {
		return nil, err
	}
	if err := metrics.Register(cfg.Registerer, &e.results); err != nil {
		return nil, err
	}
	current := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_session_records_view_current",
		Help: "1 while the stage's view of the session records (tollgate_sessions' keys) is current and a session's first entry reads no record it does not hold; 0 while first entries read their session record.",
	}, e.records.current)
	if err := metrics.Register(cfg.Registerer, &current); err != nil {
		return nil, err
	}
	e.legacyRuns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tollgate_legacy_batch_runs_total",
		Help: "Runs of version 1 batches, written before execution claims moved into the batch record: their calls are claimed in tollgate_claims.",
	})
	if err := metrics.Register(cfg.Registerer, &e.legacyRuns); err != nil {
		return nil, err
	}
	return e, nil
}

// Tools is the engine's tool catalog.
func (e *Engine) Tools() *tools.Catalog { return e.cfg.Tools }

// Authorize reports whether b's persisted TurnContext is an authentic,
// usable authority for b: sealed by a key of the ring (seal.KeyRing.Verify)
// and captured for b's turn, or for the turn whose call scheduled b as
// follow-up work. It returns a coded error (TURN_CONTEXT_MISSING,
// TURN_CONTEXT_TAMPERED, SEAL_KEY_UNKNOWN, TURN_CONTEXT_INVALID,
// TURN_CONTEXT_MISMATCH, ...) on which callers fail the batch closed.
func (e *Engine) Authorize(b *schemas.BatchRecord) error { return Authorize(e.cfg.Keys, b) }

// Authorize is Engine.Authorize with the key ring keys, for code that
// judges a batch without an engine (a shadow redrive, pipeline/replay).
func Authorize(keys *seal.KeyRing, b *schemas.BatchRecord) error {
	if err := keys.Verify(b.Context); err != nil {
		return err
	}
	return b.Context.CheckFor(b.TurnID)
}

// Worker is the id this engine records on its claims: the configured
// Worker plus a suffix unique to the engine.
func (e *Engine) Worker() string { return e.worker }

// Keys is the engine's key ring.
func (e *Engine) Keys() *seal.KeyRing { return e.cfg.Keys }

// Now is the engine's clock.
func (e *Engine) Now() time.Time { return e.cfg.Now().UTC() }

// Result builds a result for a call that did not run (its reason cut to
// MaxReasonBytes).
func (e *Engine) Result(call schemas.ToolCall, status schemas.ResultStatus, code schemas.Code, reason, approvalID string) *schemas.ToolResult {
	return &schemas.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: status, Code: code, Reason: clip(reason, MaxReasonBytes), ApprovalID: approvalID, FinishedAt: e.Now()}
}
