package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/chaos"
	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/seal"
)

// stageNames in pipeline order; also the binaries' names.
var stageNames = []string{"ingest", "executor", "approver", "redriver"}

// stageConsumer is each stage's durable consumer.
var stageConsumer = map[string]topology.ConsumerSpec{
	"ingest":   topology.IngestConsumer(),
	"executor": topology.ExecutorConsumer(),
	"approver": topology.ApproverConsumer(),
	"redriver": topology.RedriverConsumer(),
}

// buildBinaries builds tollgate, which runs the stages (and nats-server, which the
// bench does not use) into dir, as internal/chaos does.
func buildBinaries(ctx context.Context, dir string) error {
	return chaos.BuildBinaries(ctx, dir, false)
}

// stageProc is one stage binary running against an env.
type stageProc struct {
	stage string
	cmd   *exec.Cmd
	log   *os.File
	done  chan struct{}
	err   error
}

// procSet is the four stage processes of one run: Tollgate's stage
// binaries, or raw stages.
type procSet struct {
	e *env
	// command returns the command running stage (without its output).
	command func(stage string) *exec.Cmd
	// consumer is the stage's durable consumer name.
	consumer func(stage string) string
	procs    map[string]*stageProc
}

// startProcs writes a seal key file and starts the four stages (`tollgate <stage>`)
// against e, each logging to its own file, and waits until each has a pull
// request waiting on its consumer.
func startProcs(e *env, binDir, logLevel string) (*procSet, error) {
	keyFile := filepath.Join(e.dir, "seal-keys.json")
	if _, _, err := seal.EnsureFile(keyFile); err != nil {
		return nil, err
	}
	return launch(&procSet{e: e, consumer: func(s string) string { return stageConsumer[s].Config.Durable }, command: func(stage string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(binDir, "tollgate"), stage)
		cmd.Env = append(childproc.Env(),
			"TOLLGATE_NATS_URL="+e.url,
			"TOLLGATE_REPLICAS="+strconv.Itoa(max(e.st.Nodes, 1)),
			"TOLLGATE_SEAL_KEY_FILE="+keyFile,
			"TOLLGATE_SANDBOX="+e.sandbox("sandbox"),
			"TOLLGATE_METRICS_ADDR=",
			"TOLLGATE_LOG_LEVEL="+logLevel,
		)
		return cmd
	}})
}

// launch starts every stage of ps and waits until each consumes.
func launch(ps *procSet) (*procSet, error) {
	ps.procs = map[string]*stageProc{}
	for _, s := range stageNames {
		if err := ps.start(s); err != nil {
			ps.stop()
			return nil, err
		}
	}
	for _, s := range stageNames {
		if err := ps.waitReady(s, 30*time.Second); err != nil {
			ps.stop()
			return nil, err
		}
	}
	return ps, nil
}

// pids are the running processes' ids.
func (ps *procSet) pids() []int {
	var out []int
	for _, p := range ps.procs {
		out = append(out, p.cmd.Process.Pid)
	}
	return out
}

// start runs stage, logging to <stage>.log in the run's directory.
func (ps *procSet) start(stage string) error {
	logf, err := os.OpenFile(filepath.Join(ps.e.dir, stage+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := ps.command(stage)
	cmd.Dir = ps.e.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", stage, err)
	}
	p := &stageProc{stage: stage, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	ps.procs[stage] = p
	return nil
}

// waitReady waits until stage's consumer exists with a pull request
// waiting, or, for a stage that consumes nothing (the raw approver, which
// answers requests), until its log has rawReadyLine.
func (ps *procSet) waitReady(stage string, timeout time.Duration) error {
	nc, js, err := ps.e.connect("tollgate-bench-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	p := ps.procs[stage]
	stream, name := stageConsumer[stage].Stream, ps.consumer(stage)
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready; log %s", stage, p.err, p.log.Name())
		default:
		}
		if name == "" {
			if logHas(p.log.Name(), rawReadyLine) {
				return nil
			}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			info, err := consumerInfo(ctx, js, stream, name)
			cancel()
			if err == nil && info.NumWaiting > 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not consuming after %v", stage, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logHas reports whether the file at path has line as one of its lines.
func logHas(path, line string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(b), "\n"), line)
}

func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// stopOne stops stage with SIGTERM (it drains), then SIGKILL after 30s.
func (ps *procSet) stopOne(stage string) {
	p := ps.procs[stage]
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	delete(ps.procs, stage)
}

func (ps *procSet) stop() {
	for _, s := range stageNames {
		ps.stopOne(s)
	}
}

// rss returns the resident set size (VmRSS) and its peak (VmHWM) of pid in
// bytes, from /proc.
func rss(pid int) (cur, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) < 1 {
			continue
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if k == "VmRSS" {
			cur = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return cur, peak, sc.Err()
}
