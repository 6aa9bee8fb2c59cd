package stagecmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/seal"
)

// stageProcess is one stage run by runStage, with its broker on a port of
// its own that can be stopped and started, and its metrics address.
type stageProcess struct {
	t         *testing.T
	store     string
	natsPort  int
	metrics   string
	srv       *server.Server
	done      chan error
	cancel    context.CancelFunc
	runResult error
}

func newStageProcess(t *testing.T) *stageProcess {
	t.Helper()
	p := &stageProcess{t: t, store: t.TempDir(), natsPort: freePort(t), metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	t.Cleanup(func() {
		if p.srv != nil {
			p.srv.Shutdown()
			p.srv.WaitForShutdown()
		}
	})
	return p
}

// startBroker starts (or starts again) the broker on p's port and store.
func (p *stageProcess) startBroker() {
	p.t.Helper()
	srv, err := embedded.Start(embedded.Options{StoreDir: p.store, Port: p.natsPort, ReadyTimeout: jstest.Ready()})
	if err != nil {
		p.t.Fatal(err)
	}
	p.srv = srv
}

func (p *stageProcess) stopBroker() {
	p.srv.Shutdown()
	p.srv.WaitForShutdown()
	p.srv = nil
}

// common is the stage's settings.
func (p *stageProcess) common(noProvision bool) scaffold.Common {
	p.t.Helper()
	keyFile := filepath.Join(p.t.TempDir(), "seal-keys.json")
	if err := seal.NewFile("k1").Write(keyFile); err != nil {
		p.t.Fatal(err)
	}
	return scaffold.Common{NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", p.natsPort), MetricsAddr: p.metrics, LogLevel: "info", Replicas: 1,
		SandboxDir: filepath.Join(p.t.TempDir(), "sandbox"), SealKeys: keyFile, NoProvision: noProvision}
}

// run starts runStage for stage; stop cancels it and returns its result.
func (p *stageProcess) run(stage string, c scaffold.Common) {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan error, 1)
	go func() { p.done <- runStage(ctx, stage, c, pipelinetest.Logger()) }()
	p.t.Cleanup(func() { p.stop() })
}

func (p *stageProcess) stop() error {
	p.cancel()
	if p.done != nil {
		select {
		case p.runResult = <-p.done:
		case <-jstest.After(jstest.Wait):
			p.runResult = errors.New("runStage did not return after cancel")
		}
		p.done = nil
	}
	return p.runResult
}

// get fetches path from the metrics address: its status and body; 0 when
// nothing answers.
func (p *stageProcess) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.metrics + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// ready waits until /readyz answers want (200 or 503) and returns its report.
func (p *stageProcess) ready(want int, why string) health.Report {
	p.t.Helper()
	return p.readyWhen(want, why, func(health.Report) bool { return true })
}

// readyWhen is ready, waiting also for the report to satisfy ok.
func (p *stageProcess) readyWhen(want int, why string, ok func(health.Report) bool) health.Report {
	p.t.Helper()
	var rep health.Report
	jstest.Eventually(p.t, pipelinetest.Wait, why, func() bool {
		code, body := p.get("/readyz")
		rep = health.Report{}
		return code == want && json.Unmarshal([]byte(body), &rep) == nil && ok(rep)
	})
	return rep
}

// gauge is the value of tollgate_ready{stage} on /metrics, or "" if absent.
func (p *stageProcess) gauge(stage string) string {
	_, body := p.get("/metrics")
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, `tollgate_ready{stage="`+stage+`"} `); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func failing(rep health.Report) []string {
	var out []string
	for _, c := range rep.Checks {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

// A stage process serves /healthz (alive) from the start, and /readyz and
// tollgate_ready{stage} through each state: starting (waiting for its
// broker: not ready, and not before its consumer is bound), ready (every
// check listed and passing), the broker gone (not ready, naming nats),
// the broker back (ready again).
func TestAStageProcessReportsItsReadiness(t *testing.T) {
	p := newStageProcess(t)
	p.run(tollgate.StageApprover, p.common(false))

	jstest.Eventually(t, pipelinetest.Wait, "/healthz answers", func() bool { code, _ := p.get("/healthz"); return code == http.StatusOK })
	rep := p.ready(http.StatusServiceUnavailable, "not ready while the broker is down")
	if got := failing(rep); !slices.Equal(got, []string{"started"}) {
		t.Fatalf("starting: failing checks %v, want [started]: %+v", got, rep)
	}
	if g := p.gauge(tollgate.StageApprover); g != "0" {
		t.Fatalf("tollgate_ready while starting: %q, want 0", g)
	}

	p.startBroker()
	rep = p.ready(http.StatusOK, "ready once the broker is up")
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
	}
	if want := []string{"nats", "topology", "approver/consumer", "approver/pending-tracker"}; !rep.Ready || !slices.Equal(names, want) || len(failing(rep)) > 0 {
		t.Fatalf("ready: %+v, want every one of %v passing", rep, want)
	}
	if g := p.gauge(tollgate.StageApprover); g != "1" {
		t.Fatalf("tollgate_ready when ready: %q, want 1", g)
	}

	p.stopBroker()
	// The topology check's request can fail before the client has noticed
	// the closed connection: wait for the report to name nats.
	p.readyWhen(http.StatusServiceUnavailable, "not ready, naming nats, while the broker is down", func(rep health.Report) bool {
		return slices.Contains(failing(rep), "nats")
	})
	if g := p.gauge(tollgate.StageApprover); g != "0" {
		t.Fatalf("tollgate_ready with the broker down: %q, want 0", g)
	}

	p.startBroker()
	p.ready(http.StatusOK, "ready again once the broker is back")
	if err := p.stop(); err != nil {
		t.Fatalf("after cancel: %v", err)
	}
}

// A stage started with --no-provision on an empty server does not wait
// out StartupGrace and creates nothing: it exits at once with an error
// naming what is missing, its own consumer included.
func TestANoProvisionStageOnAnEmptyServerExitsNamingWhatIsMissing(t *testing.T) {
	p := newStageProcess(t)
	p.startBroker()
	start := time.Now()
	err := runStage(context.Background(), tollgate.StageApprover, p.common(true), pipelinetest.Logger())
	if !errors.Is(err, topology.ErrNotProvisioned) {
		t.Fatalf("runStage: %v, want ErrNotProvisioned", err)
	}
	for _, want := range []string{"stream TOLLGATE_DECISIONS: missing", "bucket tollgate_approvals: missing", "consumer TOLLGATE_DECISIONS/approver: missing", "tollgate provision"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Errorf("took %v to refuse", waited)
	}
	nc, js, err := scaffold.Connect(p.common(false).NATSURL, "", "observer", pipelinetest.Logger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		t.Errorf("a --no-provision stage created stream %s", name)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

// The stage binaries take --no-provision: Main with it exits with status
// 1 on an empty server (without it, the stage would provision and run).
func TestMainTakesNoProvision(t *testing.T) {
	p := newStageProcess(t)
	p.startBroker()
	c := p.common(false)
	exit := make(chan int, 1)
	go func() {
		exit <- Main(scaffold.Prog{Name: "ingest"}, tollgate.StageIngest, []string{"--nats", c.NATSURL, "--metrics", "", "--seal-keys", c.SealKeys, "--no-provision"})
	}()
	select {
	case code := <-exit:
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
	case <-jstest.After(jstest.Wait):
		t.Fatal("Main --no-provision kept running on an empty server")
	}
}

// On a provisioned server (streams, buckets, every stage consumer) a
// --no-provision stage runs and becomes ready.
func TestANoProvisionStageRunsOnAProvisionedServer(t *testing.T) {
	p := newStageProcess(t)
	p.startBroker()
	c := p.common(true)
	nc, js, err := scaffold.Connect(c.NATSURL, "", "provisioner", pipelinetest.Logger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	if err := topology.Ensure(ctx, js, topology.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	for _, spec := range tollgate.StageConsumers() {
		if _, err := topology.EnsureConsumer(ctx, js, spec); err != nil {
			t.Fatal(err)
		}
	}
	p.run(tollgate.StageExecutor, c)
	p.ready(http.StatusOK, "a --no-provision executor ready on a provisioned server")
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
}
