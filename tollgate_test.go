package tollgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
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
	if got, want := p.Tools.Names(), []string{"schedule_followup", "shout", "shout_later"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("tools %v, want %v", got, want)
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
	for i, r := range out.Results {
		c, _, err := p.Store.Claims.Get(context.Background(), r.CallID)
		if err != nil {
			t.Fatal(err)
		}
		if c.Worker != p.Engine.Worker() || !strings.HasPrefix(c.Worker, "executor@test:1#") {
			t.Errorf("claim of call %d taken by %q, want the one engine %q", i, c.Worker, p.Engine.Worker())
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
