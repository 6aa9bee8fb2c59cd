package tollgate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// report runs p's checks.
func report(p *tollgate.Pipeline) health.Report {
	r, err := health.New(nil)
	if err != nil {
		panic(err)
	}
	r.Add(p.Checks()...)
	return r.Report(context.Background())
}

func failingChecks(rep health.Report) []string {
	var out []string
	for _, c := range rep.Checks {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

// A pipeline's checks: built but not running, it is not ready (no stage's
// consumer is bound, no watch runs) though NATS and the topology are
// fine; running, every check passes; stopped, it is not ready again.
func TestAPipelineIsReadyOnlyWhileItsStagesRun(t *testing.T) {
	env := jstest.Start(t)
	p, err := tollgate.New(context.Background(), config(t, env))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ingest/consumer", "executor/consumer", "approver/consumer", "approver/pending-tracker", "redriver/consumer", "redriver/sweep"}
	rep := report(p)
	if got := failingChecks(rep); rep.Ready || !slices.Equal(got, want) {
		t.Fatalf("before Run: ready %v, failing %v, want exactly %v", rep.Ready, got, want)
	}
	if rep.Checks[0].Name != "nats" || rep.Checks[1].Name != "topology" {
		t.Fatalf("checks %+v: want nats and topology first", rep.Checks)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	jstest.Eventually(t, pipelinetest.Wait, "every check passing", func() bool { return report(p).Ready })

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := failingChecks(report(p)); !slices.Equal(got, want) {
		t.Fatalf("after Run returned: failing %v, want %v", got, want)
	}
}

// With CheckOnly New creates nothing: on a server without the stages'
// consumers it fails naming them; once they are provisioned it builds the
// pipeline.
func TestCheckOnlyChecksInsteadOfEnsuring(t *testing.T) {
	env := jstest.Start(t) // streams and buckets, no consumers
	cfg := config(t, env)
	cfg.CheckOnly, cfg.Stages = true, []string{tollgate.StageExecutor}
	_, err := tollgate.New(context.Background(), cfg)
	if !errors.Is(err, topology.ErrNotProvisioned) || !strings.Contains(err.Error(), "consumer TOLLGATE_TURNS/executor: missing") {
		t.Fatalf("New: %v, want ErrNotProvisioned naming the executor's consumer", err)
	}
	if strings.Contains(err.Error(), "ingest") {
		t.Fatalf("New checked a stage it does not run: %v", err)
	}
	for _, spec := range tollgate.StageConsumers(tollgate.StageExecutor) {
		if _, err := topology.EnsureConsumer(context.Background(), env.JS, spec); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Registerer = nil
	if _, err := tollgate.New(context.Background(), cfg); err != nil {
		t.Fatalf("New on a provisioned server: %v", err)
	}
}
