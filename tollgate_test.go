package tollgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// shout is a tool of the caller's own: it upper-cases its "text".
type shout struct{ name string }

func (s shout) Name() string { return s.name }

func (shout) Run(_ context.Context, c tools.Call) (string, error) {
	var a struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
		return "", err
	}
	return strings.ToUpper(a.Text), nil
}

// config is a complete Config on env.
func config(t *testing.T, env *jstest.Env) tollgate.Config {
	t.Helper()
	return tollgate.Config{
		JS: env.JS, Policy: policy.Default(), Keys: pipelinetest.Keys(t), Logger: pipelinetest.Logger(),
		Registerer: prometheus.NewRegistry(), Instance: "test:1",
	}
}

func TestValidateNamesWhatIsWrong(t *testing.T) {
	env := jstest.Start(t)
	tests := []struct {
		name  string
		edit  func(*tollgate.Config)
		wants []string // "" for a valid config
	}{
		{"a complete config", func(*tollgate.Config) {}, nil},
		{"every stage and tool named once", func(c *tollgate.Config) {
			c.Stages = []string{tollgate.StageRedriver, tollgate.StageIngest}
			c.Tools = []tools.Tool{tools.Echo{}, shout{"shout"}}
		}, nil},
		{"no JetStream", func(c *tollgate.Config) { c.JS = nil }, []string{"JS is required"}},
		{"no policy", func(c *tollgate.Config) { c.Policy = nil }, []string{"Policy is required"}},
		{"no keys", func(c *tollgate.Config) { c.Keys = nil }, []string{"Keys is required"}},
		{"no instance", func(c *tollgate.Config) { c.Instance = "" }, []string{"Instance is required"}},
		{"nothing at all", func(c *tollgate.Config) { *c = tollgate.Config{} },
			[]string{"JS is required", "Policy is required", "Keys is required", "Instance is required"}},
		{"an invalid topology", func(c *tollgate.Config) { c.Topology = topology.DefaultConfig(); c.Topology.Replicas = 7 }, []string{"replicas 7"}},
		{"an unknown stage", func(c *tollgate.Config) { c.Stages = []string{"ingest", "janitor"} }, []string{`unknown stage "janitor"`}},
		{"a stage named twice", func(c *tollgate.Config) { c.Stages = []string{"executor", "executor"} }, []string{`stage "executor" named twice`}},
		{"a nil tool", func(c *tollgate.Config) { c.Tools = []tools.Tool{tools.Echo{}, nil} }, []string{"Tools[1] is nil"}},
		{"a tool without a name", func(c *tollgate.Config) { c.Tools = []tools.Tool{shout{}} }, []string{"Tools[0] (tollgate_test.shout) has no name"}},
		{"two tools of one name", func(c *tollgate.Config) { c.Tools = []tools.Tool{shout{"echo"}, tools.Echo{}} }, []string{"tool echo registered twice"}},
		{"a tool in place of schedule_followup", func(c *tollgate.Config) { c.Tools = []tools.Tool{shout{"schedule_followup"}} },
			[]string{"schedule_followup is built in"}},
		{"a nil provider", func(c *tollgate.Config) { c.Providers = []tools.Provider{&pipelinetest.Provider{}, nil} }, []string{"Providers[1] is nil"}},
		{"a retention as long as the streams keep messages", func(c *tollgate.Config) { c.Retention = 30 * 24 * time.Hour }, nil},
		{"records kept for good", func(c *tollgate.Config) { c.Retention = -1 }, nil},
		{"a short retention with streams as short", func(c *tollgate.Config) {
			c.Topology = topology.DefaultConfig()
			c.Topology.MaxAge, c.Topology.DuplicateWindow, c.Retention = 20*time.Second, 10*time.Second, 20*time.Second
		}, nil},
		{"a retention shorter than the streams keep messages", func(c *tollgate.Config) { c.Retention = 24 * time.Hour },
			[]string{"retention 24h0m0s is shorter than the streams' max age 720h0m0s"}},
		{"streams kept longer than the default retention", func(c *tollgate.Config) {
			c.Topology = topology.DefaultConfig()
			c.Topology.MaxAge = 60 * 24 * time.Hour
		}, []string{"retention 720h0m0s is shorter than the streams' max age 1440h0m0s"}},
		{"a retention below the TTL's resolution", func(c *tollgate.Config) {
			c.Topology = topology.DefaultConfig()
			c.Topology.MaxAge, c.Topology.DuplicateWindow, c.Retention = time.Second/2, time.Second/4, time.Second/2
		}, []string{"retention 500ms: want at least 1s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := config(t, env)
			tc.edit(&c)
			err := c.Validate()
			if len(tc.wants) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, tollgate.ErrInvalidConfig) {
				t.Fatalf("Validate: %v, want ErrInvalidConfig", err)
			}
			for _, want := range tc.wants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate: %q does not say %q", err, want)
				}
			}
			if got := strings.Count(err.Error(), "\n") + 1; got != len(tc.wants) {
				t.Errorf("Validate reported %d problems, want %d: %v", got, len(tc.wants), err)
			}
			// New refuses the same config with the same error.
			if _, nerr := tollgate.New(context.Background(), c); nerr == nil || nerr.Error() != err.Error() {
				t.Errorf("New: %v, want %v", nerr, err)
			}
		})
	}
}

// A pipeline built by New runs a turn through all four stages: a call of
// the caller's own tool runs at once, a second one after an approval. The
// injected clock stamps every record, the one engine takes both calls'
// claims (the executor's and the redriver's), and the metrics land in the
// caller's registerer.
func TestATurnRunsThroughAPipelineBuiltByNew(t *testing.T) {
	env := jstest.Start(t)
	clock := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	pol, err := policy.Parse([]byte(`{
	  "version": "root-test",
	  "tools": {"shout": {"approval": "never"}, "shout_later": {"approval": "required"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := config(t, env)
	cfg.Policy, cfg.Registerer = pol, reg
	cfg.Tools = []tools.Tool{shout{"shout"}, shout{"shout_later"}}
	cfg.Clock = func() time.Time { return clock }
	p, err := tollgate.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := p.Tools.List(context.Background())
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	if want := []string{"schedule_followup", "shout", "shout_later"}; err != nil || strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("tools %v %v, want %v", names, err, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	}()

	// A harness on the same server that runs nothing: it sends, decides
	// and reads.
	h := pipelinetest.Start(t, pipelinetest.Options{Env: env, Stages: []string{}})
	turn := h.Send(h.Inbound("s-1", "alice", pipelinetest.Call("shout", `{"text":"now"}`), pipelinetest.Call("shout_later", `{"text":"later"}`)))
	a := h.WaitPending(schemas.ApprovalID(turn, 1))
	h.Decide(a.ApprovalID, schemas.OptionApprove, "alice")
	b, out := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || len(out.Results) != 2 || out.Results[0].Output != "NOW" || out.Results[1].Output != "LATER" {
		t.Fatalf("turn ended %s (%s): %+v", b.State, b.Code, out.Results)
	}

	a = h.Approval(a.ApprovalID)
	stamps := map[string]time.Time{
		"batch created": b.CreatedAt, "batch updated": b.UpdatedAt, "outcome finished": out.FinishedAt,
		"first result": out.Results[0].FinishedAt, "second result": out.Results[1].FinishedAt,
		"approval requested": a.RequestedAt, "approval decided": a.Decision.DecidedAt,
	}
	for what, at := range stamps {
		if !at.Equal(clock) {
			t.Errorf("%s at %v, want the injected clock's %v", what, at, clock)
		}
	}
	for i := range out.Results {
		c := b.ClaimOf(i)
		if c == nil || c.Worker != p.Engine.Worker() || !strings.HasPrefix(c.Worker, "executor@test:1#") || !c.ClaimedAt.Equal(clock) {
			t.Errorf("claim of call %d %+v, want one taken by the one engine %q at the injected clock's time", i, c, p.Engine.Worker())
		}
	}

	// One series of a vector appears with its first count: what each
	// stage did is in the caller's registerer.
	got := series(t, reg)
	for name, least := range map[string]int{
		"tollgate_messages_acked_total":   4, // one series per stage
		"tollgate_executor_calls_total":   2, // one run at once, one for approval
		"tollgate_decisions_total":        1, // applied
		"tollgate_redrive_outcomes_total": 1, // started
	} {
		if got[name] < least {
			t.Errorf("registerer: %d series of %s, want at least %d", got[name], name, least)
		}
	}
}

// Without a Registerer the metrics go to a registry of the pipeline's own,
// never the global one; with one, only the selected stages' metrics are
// registered.
func TestMetricsGoOnlyWhereTheyAreAskedFor(t *testing.T) {
	env := jstest.Start(t)
	cfg := config(t, env)
	cfg.Registerer = nil
	if _, err := tollgate.New(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for name := range series(t, prometheus.DefaultGatherer) {
		if strings.HasPrefix(name, "tollgate_") {
			t.Errorf("%s registered globally", name)
		}
	}

	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Stages = reg, []string{tollgate.StageIngest}
	if _, err := tollgate.New(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	names := series(t, reg)
	for _, other := range []string{"tollgate_approvals_requested_total", "tollgate_approvals_pending"} {
		if names[other] > 0 {
			t.Errorf("an ingest-only pipeline registered %s", other)
		}
	}
	reg = prometheus.NewRegistry()
	cfg.Registerer, cfg.Stages = reg, nil
	if _, err := tollgate.New(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	names = series(t, reg)
	for _, own := range []string{"tollgate_approvals_requested_total", "tollgate_approvals_pending"} {
		if names[own] == 0 {
			t.Errorf("a pipeline of all stages did not register %s (gathered %v)", own, names)
		}
	}
}

// The engine's claims name the stage that executes in the process, and Run
// refuses a stage the pipeline was not built to run.
func TestStagesSelectWhatRuns(t *testing.T) {
	env := jstest.Start(t)
	for _, tc := range []struct {
		stages []string
		worker string
	}{
		{nil, "executor@test:1#"},
		{[]string{tollgate.StageRedriver}, "redriver@test:1#"},
		{[]string{tollgate.StageRedriver, tollgate.StageExecutor}, "executor@test:1#"},
	} {
		cfg := config(t, env)
		cfg.Stages = tc.stages
		p, err := tollgate.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.Engine.Worker(), tc.worker) {
			t.Errorf("stages %v: engine worker %q, want %s<nonce>", tc.stages, p.Engine.Worker(), tc.worker)
		}
	}

	cfg := config(t, env)
	cfg.Stages = []string{tollgate.StageIngest}
	p, err := tollgate.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunStages(context.Background(), tollgate.StageExecutor); err == nil || !strings.Contains(err.Error(), `stage "executor" is not one of`) {
		t.Fatalf("RunStages(executor) on an ingest pipeline: %v", err)
	}
	// Run runs only the ingest stage: its consumer appears, the others' do not.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	jstest.Eventually(t, pipelinetest.Wait, "the ingest consumer", func() bool {
		c := topology.IngestConsumer()
		_, err := env.JS.Consumer(context.Background(), c.Stream, c.Config.Durable)
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	for _, c := range topology.Consumers()[1:] {
		if _, err := env.JS.Consumer(context.Background(), c.Stream, c.Config.Durable); err == nil {
			t.Errorf("an ingest pipeline created consumer %s", c.Config.Durable)
		}
	}
}

// series counts the series g gathers, by metric name. A vector has no
// series until its first observation; a plain counter or gauge has one.
func series(t *testing.T, g prometheus.Gatherer) map[string]int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, mf := range mfs {
		n[mf.GetName()] = len(mf.GetMetric())
	}
	return n
}

// A provider tool named like a static tool, or two providers' tools of one
// name, found when New lists the providers, is refused with an error that
// names the tool and both sides.
func TestNewRefusesToolNamesThatCollide(t *testing.T) {
	env := jstest.Start(t)
	provider := func(name string, tools ...tools.Tool) *pipelinetest.Provider {
		p := &pipelinetest.Provider{ProviderName: name}
		p.Set(tools...)
		return p
	}
	tests := []struct {
		name      string
		tools     []tools.Tool
		providers []tools.Provider
		wants     []string
	}{
		{"a provider tool named like a Go tool", []tools.Tool{shout{"shout"}},
			[]tools.Provider{provider("mcp:fs", shout{"shout"})}, []string{"mcp:fs offers shout", "go tool"}},
		{"a provider tool named like schedule_followup", nil,
			[]tools.Provider{provider("nats", shout{"schedule_followup"})}, []string{"nats offers schedule_followup", "builtin tool"}},
		{"two providers with one tool name", nil,
			[]tools.Provider{provider("nats", shout{"fs.read"}), provider("mcp:fs", shout{"fs.read"})}, []string{"mcp:fs offers fs.read, which provider nats already offers"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t, env)
			cfg.Tools, cfg.Providers = tc.tools, tc.providers
			_, err := tollgate.New(context.Background(), cfg)
			if err == nil {
				t.Fatal("New accepted colliding tool names")
			}
			for _, w := range append(tc.wants, "name collisions") {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("New: %q does not say %q", err, w)
				}
			}
		})
	}
}

// service is a provider that is a tools.Service: it counts its runs and
// keeps the context of the one running.
type service struct {
	pipelinetest.Provider
	fail  error // returned at once by Run, if set
	mu    sync.Mutex
	runs  int
	ctx   context.Context
	ended bool
}

func (s *service) Run(ctx context.Context) error {
	s.mu.Lock()
	s.runs++
	s.ctx, s.ended = ctx, false
	s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	<-ctx.Done()
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	return ctx.Err()
}

// state is how many times the service ran, whether one is running now and
// whether the last one has returned.
func (s *service) state() (runs int, running, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs, s.ctx != nil && s.ctx.Err() == nil, s.ended
}

// A provider that is a tools.Service runs once while the stages run, however
// many groups of stages run, and stops only after the stages have drained:
// a call in flight through it when the pipeline is stopped still finds it
// running.
func TestProviderServicesRunBesideTheStages(t *testing.T) {
	env := jstest.Start(t)
	pol, err := policy.Parse([]byte(`{"tools": {"svc.*": {"approval": "never"}}, "transports": {"cli": {"trust_boundary": "local", "interactive": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	svc := &service{Provider: pipelinetest.Provider{ProviderName: "nats"}}
	started, release := make(chan struct{}), make(chan struct{})
	var sawRunning atomic.Bool
	slow := &pipelinetest.Remote{Counter: pipelinetest.Counter{ToolName: "svc.slow"}, Fail: func(tools.Call) error {
		close(started)
		<-release
		_, running, _ := svc.state()
		sawRunning.Store(running)
		return nil
	}}
	svc.Set(slow)
	cfg := config(t, env)
	cfg.Policy, cfg.Providers = pol, []tools.Provider{svc}
	p, err := tollgate.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if runs, _, _ := svc.state(); runs != 0 {
		t.Fatalf("the service ran %d times before Run", runs)
	}

	// Two groups of stages: the service runs once for both, and goes on
	// running when one group stops.
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go func() {
		done1 <- p.RunStages(ctx1, tollgate.StageIngest, tollgate.StageApprover, tollgate.StageRedriver)
	}()
	go func() { done2 <- p.RunStages(ctx2, tollgate.StageExecutor) }()
	jstest.Eventually(t, pipelinetest.Wait, "the service running", func() bool { _, running, _ := svc.state(); return running })
	cancel1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	if runs, running, _ := svc.state(); runs != 1 || !running {
		t.Fatalf("after one group stopped: %d runs, running %v; want 1 run, still running", runs, running)
	}

	// A call through the provider is in flight when the last group stops.
	h := pipelinetest.Start(t, pipelinetest.Options{Env: env, Stages: []string{}})
	turn := h.Send(h.Inbound("svc-drain", "alice", pipelinetest.Call("svc.slow", `{}`)))
	ctx3, cancel3 := context.WithCancel(context.Background())
	go func() { done1 <- p.RunStages(ctx3, tollgate.StageIngest) }() // the turn needs ingest
	<-started
	cancel2()
	close(release)
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if !sawRunning.Load() {
		t.Fatal("the service was stopped while a call through it was in flight")
	}
	if b := h.Batch(turn); b == nil || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("batch %+v, want the call's ok result recorded before the stages stopped", b)
	}
	if runs, running, _ := svc.state(); runs != 1 || !running {
		t.Fatalf("the ingest group still runs: %d runs, running %v; want 1 run, running", runs, running)
	}
	// The last group stops: so does the service, before RunStages returns.
	cancel3()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	if runs, running, ended := svc.state(); runs != 1 || running || !ended {
		t.Fatalf("after the last group stopped: %d runs, running %v, returned %v; want 1 run, stopped and returned", runs, running, ended)
	}
}

// A provider service that returns before the pipeline stops is logged and
// not restarted; the stages go on.
func TestAProviderServiceThatStopsEarlyDoesNotStopTheStages(t *testing.T) {
	env := jstest.Start(t)
	svc := &service{Provider: pipelinetest.Provider{ProviderName: "nats"}, fail: errors.New("connection closed")}
	cfg := config(t, env)
	cfg.Providers = []tools.Provider{svc}
	cfg.Tools = []tools.Tool{tools.Echo{}}
	p, err := tollgate.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	h := pipelinetest.Start(t, pipelinetest.Options{Env: env, Stages: []string{}})
	turn := h.Send(h.Inbound("svc-failed", "alice", pipelinetest.Call("echo", `{"text":"on"}`)))
	if _, out := h.WaitTerminal(turn); out.Results[0].Output != "on" {
		t.Fatalf("outcome %+v", out)
	}
	if runs, _, _ := svc.state(); runs != 1 {
		t.Fatalf("the service ran %d times, want 1 (not restarted)", runs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
