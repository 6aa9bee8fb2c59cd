// Package gateway is Tollgate's HTTP gateway: a transport that lets agents
// submit tool calls, read turns and approvals, stream events and decide
// approvals over HTTP (/v1), authenticated by API keys.
//
// The gateway is a transport like any other: it talks to the pipeline only
// through the subjects and buckets of docs/protocol.md, under its own NATS
// user, and publishes as the transport each API key is bound to. Input is
// checked with the admission rule ingest applies (policy.(*Policy).Admit)
// before anything is published, so a request the pipeline would
// dead-letter is answered 4xx with a reason code and never reaches the
// bus. It links the protocol packages only (topology, bus, store, policy,
// eventfeed, and natstool for the NATS tool service it offers), never a
// stage.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// Runner is a background task the gateway runs next to its HTTP server,
// such as the outgoing webhook dispatcher.
type Runner interface {
	Run(ctx context.Context) error
}

// Config wires a Server.
type Config struct {
	// JS is the gateway's JetStream connection (its own NATS user).
	JS jetstream.JetStream
	// Policy is the policy ingest runs with: requests are admitted by
	// its Admit, ingest's rule, before they are published.
	Policy *policy.Policy
	// Keys are the API keys that may use the gateway (see LoadKeys).
	Keys []Key
	// Addr is the listen address of Run, e.g. "127.0.0.1:8080".
	Addr   string
	Logger *slog.Logger
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer

	// Webhooks, when set, is run by Run next to the HTTP server.
	Webhooks Runner
	// Web, when set, serves every path the gateway does not route (the
	// web approval inbox, transport/web, at "/"); paths under /v1/ stay
	// the API's.
	Web http.Handler

	// MaxBodyBytes bounds a request body (default 1 MiB); a larger one is
	// refused 413 PAYLOAD_TOO_LARGE.
	MaxBodyBytes int64
	// Rate and Burst bound the requests of one API key (default 20/s,
	// burst 40); more are refused 429 RATE_LIMITED.
	Rate  rate.Limit
	Burst int
	// SubmitWait is how long POST /v1/turns waits for the executor's first
	// facts about the calls (default 2s) before it answers without them.
	SubmitWait time.Duration
	// DecisionWait is how long POST /v1/approvals/{id}/decisions waits for
	// the approver's verdict (default 10s) before it answers 202.
	DecisionWait time.Duration
	// MaxWait caps ?wait= of a long poll (default 60s).
	MaxWait time.Duration
	// Heartbeat is the interval of SSE heartbeat comments (default 15s).
	Heartbeat time.Duration
	// MaxStreams caps the event streams (SSE) one API key holds open at
	// once in this process (default 8); one more is refused 429
	// TOO_MANY_STREAMS.
	MaxStreams int
	// Events is the process's event feed, which serves every event stream
	// from one consumer of TOLLGATE_EVENTS; share it with Web's (nil: the
	// server makes its own, stopped when Serve returns).
	Events *eventfeed.Feed
	// Now is the clock (default time.Now), for key expiry.
	Now func() time.Time
	// TracerProvider traces each request Serve serves (a server span, the
	// child of the request's W3C traceparent if any), and what a request
	// publishes carries its span (package tracing); nil is otel's global
	// provider, a no-op one unless the program set another.
	TracerProvider trace.TracerProvider
	// HTTP are the timeouts and header limit of the server Serve starts
	// (zero fields: httpserve.Defaults). Event streams, long polls and MCP
	// calls hold their own responses open (httpserve.Hold).
	HTTP httpserve.Limits
}

// Validate reports missing wiring and invalid keys.
func (c Config) Validate() error {
	if c.JS == nil || c.Policy == nil || c.Logger == nil {
		return errors.New("gateway: JS, Policy and Logger are required")
	}
	return ValidateKeys(c.Keys)
}

// Server is the gateway's HTTP server.
type Server struct {
	cfg     Config
	store   *store.Store
	events  *eventfeed.Feed
	ownFeed bool // events was made by New, and is closed by Serve
	inbound jetstream.Stream
	keys    map[string]*Key // by key id
	mux     *http.ServeMux
	// approvalIdx lists approvals (GET /v1/approvals) without a scan of
	// the bucket: every approval's list fields, by id.
	approvalIdx *store.Index[*approvalEntry]
	// batchReads: the approvals bucket allows direct gets, so a list page
	// reads its records in one batched direct get (readApprovals).
	batchReads bool
	batchJS    jetstream.JetStream // cfg.JS, where batched reads are sent
	// batchReadsOffUntil (Unix nanoseconds): until then, after a batched
	// read failed, pages are read one by one.
	batchReadsOffUntil atomic.Int64

	requests  *prometheus.CounterVec
	listReads *prometheus.CounterVec // by how: batched, one_by_one
	feed      batchFeed              // writes of the batch records, for waiting requests
	answers   eventFeed              // decisions' answers, for the requests that published them

	mu        sync.Mutex
	limiters  map[string]*rate.Limiter        // by key id
	approvals recent[*schemas.ApprovalRecord] // read for views, by id (decisionApproval)
}

// New binds to the pipeline's streams and buckets (which must exist:
// jetstream.ErrBucketNotFound / ErrStreamNotFound otherwise) and returns a
// Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = schemas.MaxPayloadBytes
	}
	if cfg.Rate == 0 {
		cfg.Rate, cfg.Burst = 20, 40
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 1
	}
	if cfg.SubmitWait <= 0 {
		cfg.SubmitWait = 2 * time.Second
	}
	if cfg.DecisionWait <= 0 {
		cfg.DecisionWait = 10 * time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 60 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 8
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := topology.OpenBuckets(ctx, cfg.JS)
	if err != nil {
		return nil, err
	}
	if _, err := cfg.JS.Stream(ctx, topology.StreamEvents); err != nil {
		return nil, fmt.Errorf("gateway: stream %s: %w", topology.StreamEvents, err)
	}
	events, ownFeed := cfg.Events, false
	if events == nil {
		events, ownFeed = eventfeed.New(cfg.JS, cfg.Logger), true
	}
	inbound, err := cfg.JS.Stream(ctx, topology.StreamInbound)
	if err != nil {
		return nil, fmt.Errorf("gateway: stream %s: %w", topology.StreamInbound, err)
	}
	s := &Server{
		cfg: cfg, store: store.New(b), events: events, ownFeed: ownFeed, inbound: inbound,
		keys: map[string]*Key{}, limiters: map[string]*rate.Limiter{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_gateway_requests_total",
			Help: "HTTP requests the gateway answered, by route and status.",
		}, []string{"route", "status"}),
		listReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_gateway_list_reads_total",
			Help: "Reads of a list page's approval records: \"batched\" (one batched direct get) or \"one_by_one\" (a get per record: a bucket without direct gets, or after a batched get failed, which counts \"batch_failed\" and reads one by one for a minute).",
		}, []string{"how"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.requests, s.listReads} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("gateway: metrics: %w", err)
			}
		}
	}
	for i := range cfg.Keys {
		s.keys[cfg.Keys[i].ID] = &cfg.Keys[i]
	}
	if s.approvalIdx, err = startApprovalIndex(ctx, s.store, cfg.Logger); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if st, err := s.store.Approvals.KV.Status(ctx); err == nil {
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			s.batchReads, s.batchJS = bs.StreamInfo().Config.AllowDirect, cfg.JS
		}
	}
	s.mux = http.NewServeMux()
	s.routes()
	return s, nil
}

// Handler is the gateway's HTTP handler: every route of /v1, /healthz and
// whatever other parts of the package register (routes), and Config.Web
// for every other path.
func (s *Server) Handler() http.Handler {
	if s.cfg.Web == nil {
		return s.mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := s.mux.Handler(r); pattern == "/" && !strings.HasPrefix(r.URL.Path, "/v1/") {
			s.cfg.Web.ServeHTTP(w, r)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// Run listens on Config.Addr and serves until ctx is cancelled, then shuts
// down gracefully (open requests get 5 s). It also runs Config.Webhooks
// when set; the first of them to fail stops both.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Close stops the server's watch of the approvals bucket (it also ends
// when the connection closes, and when Serve returns). Lists are not
// served after it.
func (s *Server) Close() error { return s.approvalIdx.Stop() }

// Serve is Run on a listener the caller opened.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.ownFeed {
		defer s.events.Close()
	}
	defer func() { _ = s.Close() }()
	srv := httpserve.New(tracing.HTTP(s.cfg.TracerProvider, s.Handler()), s.cfg.HTTP, ctx)
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(ln) }()
	if s.cfg.Webhooks != nil {
		go func() { errs <- s.cfg.Webhooks.Run(ctx) }()
	}
	s.cfg.Logger.Info("gateway listening", "addr", ln.Addr().String())
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
		cancel()
	}
	shut, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	if err := srv.Shutdown(shut); err != nil && first == nil {
		first = err
	}
	if errors.Is(first, http.ErrServerClosed) || errors.Is(first, context.Canceled) {
		first = nil
	}
	return first
}
