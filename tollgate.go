// Package tollgate builds Tollgate's four pipeline stages (ingest,
// executor, approver, redriver) from a Config in which every dependency is
// passed in: the JetStream handle, the policy, the seal keys, the tools,
// the logger, the metrics registerer and the clock. It is the one place
// that wires the stages: the stage binaries, `tollgate dev`, the tests and
// the benchmarks all go through New, and a program of its own can too, to
// run the stages with its own tools without forking Tollgate (see
// examples/customtool).
//
// What New builds, for one process:
//
//   - the topology, ensured (created or converged) with Config.Topology,
//     or with Config.CheckOnly only checked, with the consumers of the
//     selected stages (StageConsumers);
//   - one store over the KV buckets, reading older approval records through
//     the one compatibility path (pipeline/legacy), and removing the records
//     of ended turns after Config.Retention (store.Store.Retain);
//   - one tool catalog (tools.Catalog): Config.Tools plus
//     schedule_followup, which is part of the pipeline and is always added,
//     wired to the engine, and the tools of Config.Providers, resolved by
//     name whenever a call needs its tool. New lists each provider once, as
//     it is before its service runs, and refuses a name collision it finds
//     then (see tools.NewCatalog);
//   - one batch engine, shared by the executor and the redriver. Its
//     in-flight set is what keeps two goroutines of one process from both
//     taking the process's own execution claim for the same call (the
//     claim in KV keeps processes apart; the engine keeps the stages of one
//     process apart), so a process never has two;
//   - one set of runner metrics, shared by the stages;
//   - where Config.Planner is set, the planner (pipeline/planner), an
//     optional fifth stage selected by default with the four, over the same
//     store and engine; ingest then routes turns with text and no calls to
//     it (also where only Config.PlanText is set);
//   - all four stages, whichever are selected (Config.Stages), so that a
//     test can call Handle, Apply or Redrive on a stage that does not run.
//     Only the selected stages register their own metrics: a process
//     exposes the metrics of what it runs.
//
// Nothing is changed after New returns: the pipeline is wired completely
// before any stage can run. Run runs the selected stages until its context
// is cancelled, and beside them every provider that is a tools.Service
// (NATS tool discovery, MCP server supervision); at the end the stages
// drain first, then the providers stop, so that no call in flight loses
// the provider it runs through.
//
// Readiness: Checks are the pipeline's health checks (package health), for
// /readyz and the gauge tollgate_ready{stage}.
//
// Failures: New fails with ErrInvalidConfig (see Config.Validate) before it
// touches the broker; with the broker's error when the topology cannot be
// ensured or the buckets opened; with an error wrapping
// topology.ErrNotProvisioned, naming what is missing or different, when
// Config.CheckOnly finds the topology not provisioned (New does not wait for a broker that is
// still starting: internal/stagecmd does that first); with the catalog's
// error when the tools collide (tools.NewCatalog); and with a stage's
// error when a stage cannot be constructed (e.g. ToolTimeout not below
// ClaimLease). Logs go to Config.Logger; nothing is printed.
package tollgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/legacy"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// Stage names, as accepted in Config.Stages.
const (
	StageIngest   = ingest.Stage
	StageExecutor = executor.Stage
	StageApprover = approver.Stage
	StageRedriver = redriver.Stage
	// StagePlanner is the optional fifth stage (Config.Planner): not in
	// AllStages, selected by default only where a planner is configured.
	StagePlanner = planner.Stage
)

// AllStages returns the four stage names in pipeline order.
func AllStages() []string {
	return []string{StageIngest, StageExecutor, StageApprover, StageRedriver}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("tollgate: invalid config")

// Config is everything New needs. JS, Policy, Keys and Instance are
// required; every other field has a default.
type Config struct {
	// JS is the JetStream handle every stage uses (one connection per
	// process is enough).
	JS jetstream.JetStream
	// Policy decides, per call, whether it runs, waits for an approval or
	// is denied.
	Policy *policy.Policy
	// Keys seal the TurnContext of every turn ingest accepts, and verify it
	// wherever it is used.
	Keys *seal.KeyRing
	// Tools are the tools turns may call (tools.Builtins has echo and
	// write_file), besides schedule_followup, which New always adds. Names
	// must be unique.
	Tools []tools.Tool
	// Providers supply tools that live outside this process (NATS tool
	// services, MCP servers), resolved by name whenever a call needs its
	// tool. A provider that is a tools.Service is run beside the stages.
	Providers []tools.Provider
	// Logger receives every stage's log; nil discards it.
	Logger *slog.Logger
	// Registerer receives every metric; nil registers them with a private
	// registry (never prometheus.DefaultRegisterer). One Registerer serves
	// one Pipeline.
	Registerer prometheus.Registerer
	// Clock stamps records and judges claim leases and approval expiry
	// (batch.Config.Now, approver.Config.Now); nil is time.Now.
	Clock func() time.Time
	// Instance names this process in worker ids (stage + "@" + Instance),
	// e.g. "host:pid".
	Instance string
	// Topology is what New ensures; the zero value is
	// topology.DefaultConfig().
	Topology topology.Config
	// CheckOnly: New does not create or update the topology (streams,
	// buckets, the selected stages' consumers: `tollgate provision` does
	// that, as an admin user) but only checks that it exists and is
	// compatible (topology.Check), and fails if not. The stage binaries'
	// --no-provision; false (ensure it) is the laptop default.
	CheckOnly bool
	// Stages are the stages Run runs and whose metrics are registered; nil
	// is AllStages(). All four are constructed either way.
	Stages []string
	// TracerProvider receives the spans of every stage handler and tool
	// call (package tracing; docs/operations.md, Traces); nil is otel's
	// global provider, a no-op one unless the program set another: off.
	TracerProvider trace.TracerProvider

	// Planner, if set, builds the planner stage (pipeline/planner) with
	// these settings, and ingest routes turns with text and no calls to
	// it. Nil: no planner; such turns go to the executor as before.
	Planner *planner.Options
	// PlanText routes turns with text and no calls to the planner even
	// where this process runs no planner (an ingest-only process of a
	// deployment whose planner runs elsewhere: `ingest --plan`).
	PlanText bool

	// Tuning, for tests; zero is the owning package's default.
	ClaimLease      time.Duration // batch.Config.ClaimLease
	ToolTimeout     time.Duration // batch.Config.ToolTimeout
	OrderWait       time.Duration // executor.Config.OrderWait and planner.Config.OrderWait
	PreviewDeadline time.Duration // executor.Config.PreviewDeadline
	PreviewsPerTool int           // executor.Config.PreviewsPerTool
	SweepInterval   time.Duration // redriver.Config.SweepInterval (negative: no sweep passes; its watch still runs)
	SweepAfter      time.Duration // redriver.Config.SweepAfter

	// Retention is how long ended records stay in KV (store.Store.Retain):
	// terminal batches, idle sessions, and the approvals and execution
	// claims of a turn whose batch has ended. Zero is
	// store.DefaultRetention; negative keeps every record. It must be at
	// least the streams' max age (Topology.MaxAge): a message is
	// redelivered for as long as its stream holds it (the consumers have no
	// MaxDeliver, and a recreated consumer starts over), and a trigger of a
	// turn whose records are gone would run it again (docs/operations.md,
	// "Retention").
	Retention time.Duration
}

// retention is c.Retention with its default applied; 0 keeps every record.
func (c *Config) retention() time.Duration {
	switch {
	case c.Retention == 0:
		return store.DefaultRetention
	case c.Retention < 0:
		return 0
	}
	return c.Retention
}

// notFoundGrace is the approver's NotFoundGrace for topology t: on a
// cluster (more than one replica) a missing approval record may be a
// read not current yet, for a while after a leader change.
func notFoundGrace(t topology.Config) time.Duration {
	if t.Replicas > 1 {
		return approver.DefaultNotFoundGrace
	}
	return 0
}

// Validate reports every problem with the wiring, joined, each wrapping
// ErrInvalidConfig: a missing dependency, an invalid topology, an unknown or
// repeated stage, a nil, unnamed or repeated tool, or a tool named like the
// built-in schedule_followup, or a nil provider, or a retention below a
// second or shorter than the streams' max age. It does not change c.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...)))
	}
	if c.JS == nil {
		bad("JS is required")
	}
	if c.Policy == nil {
		bad("Policy is required")
	}
	if c.Keys == nil {
		bad("Keys is required")
	}
	if c.Instance == "" {
		bad("Instance is required")
	}
	if c.Topology != (topology.Config{}) {
		if err := c.Topology.Validate(); err != nil {
			bad("%v", err)
		}
	}
	topo := c.Topology
	if topo == (topology.Config{}) {
		topo = topology.DefaultConfig()
	}
	switch r := c.retention(); {
	case r > 0 && r < time.Second:
		bad("retention %v: want at least 1s (or negative to keep every record)", r)
	case r > 0 && r < topo.MaxAge:
		bad("retention %v is shorter than the streams' max age %v: a message still in a stream could run its turn again once the turn's records are gone", r, topo.MaxAge)
	}
	for i, s := range c.Stages {
		switch {
		case s == StagePlanner && c.Planner == nil:
			bad("stage %q needs Planner settings", s)
		case s != StagePlanner && !slices.Contains(AllStages(), s):
			bad("unknown stage %q (want one of %v)", s, AllStages())
		case slices.Contains(c.Stages[:i], s):
			bad("stage %q named twice", s)
		}
	}
	followUp := new(tools.FollowUp).Name()
	names := map[string]bool{}
	for i, t := range c.Tools {
		switch {
		case t == nil:
			bad("Tools[%d] is nil", i)
		case t.Name() == "":
			bad("Tools[%d] (%T) has no name", i, t)
		case t.Name() == followUp:
			bad("Tools[%d]: %s is built in and always registered", i, followUp)
		case names[t.Name()]:
			bad("tool %s registered twice", t.Name())
		default:
			names[t.Name()] = true
		}
	}
	for i, p := range c.Providers {
		if p == nil {
			bad("Providers[%d] is nil", i)
		}
	}
	return errors.Join(errs...)
}

// Pipeline is the wired stages of one process. Its fields are set by New
// and must not be changed.
type Pipeline struct {
	Store  *store.Store
	Tools  *tools.Catalog
	Engine *batch.Engine // the one engine of the executor and the redriver

	Ingest   *ingest.Ingest
	Executor *executor.Executor
	Approver *approver.Approver
	Redriver *redriver.Redriver
	Planner  *planner.Planner // nil without Config.Planner

	stages   []string
	services services

	// For Checks.
	js      jetstream.JetStream
	topo    topology.Config
	metrics *runner.Metrics
}

// New validates cfg, ensures the topology and builds the pipeline. See the
// package doc for what it builds and how it fails.
func New(ctx context.Context, cfg Config) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	now := cfg.Clock
	if now == nil {
		now = time.Now
	}
	topo := cfg.Topology
	if topo == (topology.Config{}) {
		topo = topology.DefaultConfig()
	}
	p := &Pipeline{stages: cfg.Stages, js: cfg.JS, topo: topo}
	if p.stages == nil {
		p.stages = AllStages()
		if cfg.Planner != nil {
			p.stages = append(p.stages, StagePlanner)
		}
	}
	// A stage that does not run in this process is constructed without
	// its own metrics, so that a process exposes only what it runs.
	regOf := func(stage string) prometheus.Registerer {
		if slices.Contains(p.stages, stage) {
			return reg
		}
		return nil
	}

	if cfg.CheckOnly {
		consumers := StageConsumers(p.stages...)
		if slices.Contains(p.stages, StageIngest) && (cfg.Planner != nil || cfg.PlanText) {
			consumers = append(consumers, IngestPlanConsumer())
		}
		if err := topology.Check(ctx, cfg.JS, topo, consumers); err != nil {
			return nil, err
		}
	} else if err := topology.Ensure(ctx, cfg.JS, topo); err != nil {
		return nil, err
	}
	buckets, err := topology.OpenBuckets(ctx, cfg.JS)
	if err != nil {
		return nil, err
	}
	compat, err := legacy.New(cfg.Keys, log, reg)
	if err != nil {
		return nil, err
	}
	p.Store = store.New(buckets)
	p.Store.Approvals.Decode = compat.DecodeApproval
	p.Store.Retain(cfg.JS, cfg.retention())

	// schedule_followup needs the engine, and the engine the catalog
	// that holds schedule_followup: the tool gets a scheduler that forwards
	// to the engine, set below before anything can run.
	sched := &engineScheduler{}
	static := append(slices.Clone(cfg.Tools), &tools.FollowUp{Scheduler: sched})
	if p.Tools, err = tools.NewCatalog(ctx, static, cfg.Providers, log.With("component", "tools")); err != nil {
		return nil, err
	}
	p.services.log = log.With("component", "tools")
	for _, pr := range cfg.Providers {
		if svc, ok := pr.(tools.Service); ok {
			p.services.run = append(p.services.run, svc)
			p.services.names = append(p.services.names, pr.Name())
		}
	}
	// The engine's claims name the stage that executes in this process:
	// the executor where it runs, else the redriver.
	worker := StageExecutor
	if !slices.Contains(p.stages, StageExecutor) && slices.Contains(p.stages, StageRedriver) {
		worker = StageRedriver
	}
	// The engine's metrics (turns ended, call results, the session
	// records' view) belong to every process that runs a stage using it:
	// a planner-only process ends turns too.
	var engineReg prometheus.Registerer
	if slices.ContainsFunc(p.stages, func(s string) bool { return s == StageExecutor || s == StageRedriver || s == StagePlanner }) {
		engineReg = reg
	}
	if p.Engine, err = batch.New(batch.Config{
		JS: cfg.JS, Store: p.Store, Tools: p.Tools, Keys: cfg.Keys, Worker: worker + "@" + cfg.Instance, Logger: log,
		ClaimLease: cfg.ClaimLease, ToolTimeout: cfg.ToolTimeout, Now: now, Registerer: engineReg,
	}); err != nil {
		return nil, err
	}
	sched.engine = p.Engine

	metrics := runner.NewMetrics(reg)
	p.metrics = metrics
	stageLog := func(s string) *slog.Logger { return log.With("stage", s) }
	if p.Ingest, err = ingest.New(ingest.Config{
		JS: cfg.JS, Policy: cfg.Policy, Keys: cfg.Keys, Logger: stageLog(StageIngest), Metrics: metrics,
		Instance: StageIngest + "@" + cfg.Instance, TracerProvider: cfg.TracerProvider, Plan: cfg.Planner != nil || cfg.PlanText,
		Registerer: regOf(StageIngest), OrderWait: cfg.OrderWait, Now: now,
	}); err != nil {
		return nil, err
	}
	if p.Executor, err = executor.New(executor.Config{
		JS: cfg.JS, Store: p.Store, Engine: p.Engine, Policy: cfg.Policy, Logger: stageLog(StageExecutor), Metrics: metrics,
		Registerer: regOf(StageExecutor), OrderWait: cfg.OrderWait, TracerProvider: cfg.TracerProvider,
		PreviewDeadline: cfg.PreviewDeadline, PreviewsPerTool: cfg.PreviewsPerTool,
	}); err != nil {
		return nil, err
	}
	if p.Approver, err = approver.New(approver.Config{
		JS: cfg.JS, Store: p.Store, Policy: cfg.Policy, Keys: cfg.Keys, Logger: stageLog(StageApprover), Metrics: metrics,
		Registerer: regOf(StageApprover), Now: now, TracerProvider: cfg.TracerProvider,
		NotFoundGrace: notFoundGrace(topo),
	}); err != nil {
		return nil, err
	}
	if p.Redriver, err = redriver.New(redriver.Config{
		JS: cfg.JS, Store: p.Store, Engine: p.Engine, Policy: cfg.Policy, Logger: stageLog(StageRedriver), Metrics: metrics,
		Registerer: regOf(StageRedriver), SweepInterval: cfg.SweepInterval, SweepAfter: cfg.SweepAfter,
		TracerProvider: cfg.TracerProvider,
	}); err != nil {
		return nil, err
	}
	if cfg.Planner != nil {
		if p.Planner, err = planner.New(ctx, planner.Config{
			Options: *cfg.Planner, JS: cfg.JS, Store: p.Store, Engine: p.Engine, Policy: cfg.Policy,
			Logger: stageLog(StagePlanner), Metrics: metrics, Registerer: regOf(StagePlanner),
			Topology: topo, CheckOnly: cfg.CheckOnly, TracerProvider: cfg.TracerProvider, OrderWait: cfg.OrderWait,
			Retention: cfg.retention(),
		}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// engineScheduler is schedule_followup's tools.Scheduler: the pipeline's
// engine, which New sets before any stage can run.
type engineScheduler struct{ engine *batch.Engine }

func (s *engineScheduler) ScheduleFollowUp(ctx context.Context, from tools.Call, tool, args string, delay time.Duration) (string, error) {
	return s.engine.ScheduleFollowUp(ctx, from, tool, args, delay)
}

// Stages returns the stages Run runs (Config.Stages, or all four).
func (p *Pipeline) Stages() []string { return slices.Clone(p.stages) }

// StageConsumers returns the durable consumers of stages (all four when
// none are named) as their runners create them: the topology's consumer
// (topology.Consumers) with the runner's settings (runner.ConsumerConfig).
// It is what `tollgate provision` creates and what CheckOnly checks for.
func StageConsumers(stages ...string) []topology.ConsumerSpec {
	if len(stages) == 0 {
		stages = AllStages()
	}
	var out []topology.ConsumerSpec
	for i, spec := range topology.Consumers() { // in the order of AllStages
		if slices.Contains(stages, AllStages()[i]) {
			spec.Config = runner.ConsumerConfig(spec.Config)
			out = append(out, spec)
		}
	}
	if slices.Contains(stages, StageRedriver) {
		spec := topology.RedriverNoticesConsumer()
		spec.Config = runner.ConsumerConfig(spec.Config)
		out = append(out, spec)
	}
	if slices.Contains(stages, StagePlanner) {
		for _, spec := range topology.PlannerConsumers() {
			spec.Config = runner.ConsumerConfig(spec.Config)
			out = append(out, spec)
		}
	}
	return out
}

// IngestPlanConsumer is ingest's durable on the planner's step batches
// (topology.IngestStepsConsumer) as its runner creates it. Ingest consumes
// it where text-only turns go to a planner (Config.Planner or
// Config.PlanText); `tollgate provision --planner` creates it, and ingest
// with CheckOnly checks for it.
func IngestPlanConsumer() topology.ConsumerSpec {
	spec := topology.IngestStepsConsumer()
	spec.Config = runner.ConsumerConfig(spec.Config)
	return spec
}

// Checks are the pipeline's readiness checks (package health), which hold
// while Run runs its stages and they work:
//
//   - "nats": the connection of Config.JS is connected;
//   - "topology": the streams and buckets exist and are compatible
//     (topology.Check; asked of the server at most every
//     topologyCheckEvery);
//   - "<stage>/consumer", for each selected stage: its runner has bound its
//     consumer and is consuming, and is not draining (runner.Runner.Ready);
//   - "approver/pending-tracker" where the approver runs: its watch of the
//     approvals bucket runs (the approvals' expiry);
//   - "redriver/sweep" where the redriver runs with its sweep on: the
//     recovery sweep's watch of the batches bucket runs.
//
// A check is labelled with its stage, or none ("nats", "topology").
func (p *Pipeline) Checks() []health.Check {
	topo := &cachedCheck{every: topologyCheckEvery, check: func(ctx context.Context) error {
		return topology.Check(ctx, p.js, p.topo, nil)
	}}
	checks := []health.Check{health.NATS(p.js.Conn()), {Name: "topology", Check: func(ctx context.Context) error {
		if !p.js.Conn().IsConnected() {
			return errors.New("not checked: nats not connected")
		}
		return topo.run(ctx)
	}}}
	for _, s := range p.stages {
		checks = append(checks, health.Check{Name: s + "/consumer", Stage: s, Check: func(context.Context) error {
			return p.metrics.Consuming(s)
		}})
		switch {
		case s == StageApprover:
			checks = append(checks, health.Check{Name: s + "/pending-tracker", Stage: s, Check: func(context.Context) error {
				return p.Approver.Watching()
			}})
		case s == StageRedriver:
			// The sweep's watch runs even with its passes off: it wakes the
			// sessions' queued turns.
			checks = append(checks, health.Check{Name: s + "/sweep", Stage: s, Check: func(context.Context) error {
				return p.Redriver.Sweeping()
			}})
		}
	}
	return checks
}

// topologyCheckEvery is how often the "topology" check asks the server
// (nine stream lookups); in between it answers with its last result.
const topologyCheckEvery = 10 * time.Second

// cachedCheck runs check at most every every, answering with the last
// result in between. A check cut short by its caller's context is not
// kept.
type cachedCheck struct {
	every time.Duration
	check func(context.Context) error

	mu   sync.Mutex
	at   time.Time
	last error
}

func (c *cachedCheck) run(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.every {
		return c.last
	}
	err := c.check(ctx)
	if ctx.Err() == nil {
		c.at, c.last = time.Now(), err
	}
	return err
}

// Run runs the selected stages until ctx is cancelled and every one has
// returned (each drains what it holds first). The first stage to fail
// cancels the others; its error, naming the stage, is returned. A stage
// stopped by the cancellation (even one still starting, whose error is
// then context.Canceled) has not failed: Run returns nil.
//
// The providers that are a tools.Service run while any Run or RunStages of
// the pipeline runs: started by the first, stopped after the stages of the
// last have drained. A provider whose service returns early is logged as
// an error and not restarted; the stages go on (a call through it then
// fails closed with a code, as for any tool that cannot be reached).
func (p *Pipeline) Run(ctx context.Context) error { return p.RunStages(ctx, p.stages...) }

// RunStages is Run for some of the selected stages, e.g. to stop and start
// one stage while the others keep running. A stage that was not selected
// (Config.Stages) is refused, since its metrics are not registered.
func (p *Pipeline) RunStages(ctx context.Context, stages ...string) error {
	for _, s := range stages {
		if !slices.Contains(p.stages, s) {
			return fmt.Errorf("tollgate: stage %q is not one of this pipeline's stages %v", s, p.stages)
		}
	}
	p.services.acquire()
	defer p.services.release()
	return p.runStages(ctx, stages)
}

// runStages runs stages (all selected) until ctx is cancelled.
func (p *Pipeline) runStages(ctx context.Context, stages []string) error {
	runs := make([]func(context.Context) error, 0, len(stages))
	for _, s := range stages {
		runs = append(runs, p.run(s))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(runs))
	for i, run := range runs {
		go func() {
			err := run(ctx)
			if err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
				errc <- fmt.Errorf("stage %s: %w", stages[i], err)
				return
			}
			errc <- nil
		}()
	}
	var first error
	for range runs {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// run is the Run method of stage s.
func (p *Pipeline) run(s string) func(context.Context) error {
	switch s {
	case StageIngest:
		return p.Ingest.Run
	case StageExecutor:
		return p.Executor.Run
	case StageApprover:
		return p.Approver.Run
	case StagePlanner:
		return p.Planner.Run
	default:
		return p.Redriver.Run
	}
}

// services runs the providers' services while at least one RunStages of
// the pipeline runs (see Run), on a context of their own, so that each
// runs once however many stage groups run.
type services struct {
	run   []tools.Service
	names []string
	log   *slog.Logger

	mu     sync.Mutex
	users  int
	cancel context.CancelFunc
	done   chan struct{}
}

// acquire starts the services if no RunStages runs them yet.
func (s *services) acquire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users++
	if s.users > 1 || len(s.run) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	for i, svc := range s.run {
		wg.Go(func() {
			err := svc.Run(ctx)
			if ctx.Err() == nil {
				s.log.Error("tool provider stopped before the pipeline; its tools are no longer refreshed", "provider", s.names[i], "err", err)
			} else if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Warn("tool provider stopped with an error", "provider", s.names[i], "err", err)
			}
		})
	}
	go func(done chan struct{}) { wg.Wait(); close(done) }(s.done)
}

// release stops the services, and waits for them, when the last
// RunStages that runs them has returned (its stages have drained).
func (s *services) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
	if s.users > 0 || s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cancel, s.done = nil, nil
}
