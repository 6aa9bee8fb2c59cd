package stagecmd_test

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
	"github.com/tollgate-dev/tollgate/policy"
)

func TestFlagsDefaultFromTheEnvironment(t *testing.T) {
	t.Setenv("TOLLGATE_NATS_URL", "nats://127.0.0.1:5222")
	t.Setenv("TOLLGATE_NATS_CREDS", "/etc/tollgate/executor.creds")
	t.Setenv("TOLLGATE_METRICS_ADDR", "127.0.0.1:9999")
	t.Setenv("TOLLGATE_POLICY", "/etc/tollgate/policy.json")
	t.Setenv("TOLLGATE_SANDBOX", "/var/lib/tollgate/sandbox")
	t.Setenv("TOLLGATE_REPLICAS", "3")
	t.Setenv("TOLLGATE_LOG_LEVEL", "debug")
	var c stagecmd.Common
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := stagecmd.Common{NATSURL: "nats://127.0.0.1:5222", Creds: "/etc/tollgate/executor.creds", MetricsAddr: "127.0.0.1:9999",
		LogLevel: "debug", Replicas: 3, PolicyPath: "/etc/tollgate/policy.json", SandboxDir: "/var/lib/tollgate/sandbox"}
	if c != want {
		t.Fatalf("from the environment: %+v, want %+v", c, want)
	}

	// A flag beats the environment.
	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse([]string{"--nats", "nats://127.0.0.1:6222", "--metrics", ""}); err != nil {
		t.Fatal(err)
	}
	if c.NATSURL != "nats://127.0.0.1:6222" || c.MetricsAddr != "" {
		t.Fatalf("flags did not override the environment: %+v", c)
	}
}

func TestBuildWiresTheNamedStagesAndRefusesUnknownOnes(t *testing.T) {
	env := jstest.Start(t)
	deps := stagecmd.Deps{
		JS: env.JS, Policy: policy.Default(), Keys: pipelinetest.Keys(t), SandboxDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Instance: "test:1", Topology: topology.DefaultConfig(),
	}
	runs, err := stagecmd.Build(context.Background(), deps, stagecmd.AllStages...)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != len(stagecmd.AllStages) {
		t.Fatalf("%d run functions for %d stages", len(runs), len(stagecmd.AllStages))
	}
	deps.Registry = prometheus.NewRegistry()
	if _, err := stagecmd.Build(context.Background(), deps, "ingest", "janitor"); err == nil {
		t.Fatal("Build accepted an unknown stage")
	}

	// Running them creates each stage's durable consumer; cancelling drains.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- stagecmd.RunAll(ctx, runs) }()
	for _, c := range []struct{ stream, name string }{
		{topology.StreamInbound, topology.ConsumerIngest}, {topology.StreamTurns, topology.ConsumerExecutor},
		{topology.StreamDecisions, topology.ConsumerApprover}, {topology.StreamEvents, topology.ConsumerRedriver},
	} {
		jstest.Eventually(t, 10*time.Second, "consumer "+c.name, func() bool {
			_, err := env.JS.Consumer(context.Background(), c.stream, c.name)
			return err == nil
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAll after cancel: %v", err)
	}
}
