// Package e2e runs Tollgate as an operator would: one nats-server and the
// four stages as separate processes (`tollgate ingest`, ...), driven only through the
// tollgate CLI (plus raw NATS where a misbehaving transport is simulated and
// where stored state is inspected).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// binaries are the programs the test runs: tollgate runs each stage
// (`tollgate ingest`, ...).
var binaries = []string{"tollgate", "nats-server"}

// buildBinaries is the directory of tollgate and nats-server: make test's
// (childproc.EnvBin), else built into a temporary directory.
// TOLLGATE_E2E_RACE=1 always builds tollgate with -race (the processes
// then report data races in their logs, which fail the test).
func buildBinaries(t *testing.T) string {
	t.Helper()
	start := time.Now()
	dir, err := childproc.Binaries(context.Background(), t.TempDir(), os.Getenv("TOLLGATE_E2E_RACE") == "1", binaries, "./cmd/tollgate")
	if err != nil {
		t.Fatalf("build the binaries: %v", err)
	}
	t.Logf("binaries in %s: %v", dir, time.Since(start).Round(time.Millisecond))
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("binary %s was not built: %v", b, err)
		}
	}
	return dir
}

// freePort is a loopback TCP port that was free a moment ago, below the
// ephemeral range (embedded.FreePort), for a process that starts later.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

// proc is a running child process whose output goes to a log file.
type proc = childproc.Proc

// kill SIGKILLs p and waits for it to be gone.
func kill(t *testing.T, p *proc) {
	t.Helper()
	if err := p.Kill(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// cluster is one nats-server and the four stage processes.
type cluster struct {
	top    *testing.T // owns the cleanups: processes outlive subtests
	bin    string
	dir    string
	logDir string
	sbox   string // the write_file sandbox of executor and redriver
	keys   string // the TurnContext seal key file every stage loads
	url    string
	natsP  *proc // the running nats-server
	nc     *nats.Conn
	js     jetstream.JetStream

	mu      sync.Mutex
	procs   []*proc
	seq     map[string]int
	stages  map[string]*proc
	metrics map[string]string // stage -> host:port of its /metrics
}

func newCluster(t *testing.T, bin string) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{
		top: t, bin: bin, dir: dir, logDir: filepath.Join(dir, "logs"), sbox: filepath.Join(dir, "sandbox"),
		seq: map[string]int{}, stages: map[string]*proc{}, metrics: map[string]string{},
		keys: filepath.Join(dir, "seal-keys.json"),
	}
	// One key file for every stage, made by the operator command.
	if out, err := exec.Command(filepath.Join(bin, "tollgate"), "keys", "new", "--file", c.keys).CombinedOutput(); err != nil {
		t.Fatalf("tollgate keys new: %v\n%s", err, out)
	}
	if err := os.MkdirAll(c.logDir, 0o750); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after every process has stopped
	// and its log is complete.
	t.Cleanup(c.dumpLogs)
	// nats-server stops after the stages (cleanups run last-in first-out),
	// even one restarted mid-test, so the stages can drain on SIGTERM.
	t.Cleanup(func() {
		if c.natsP != nil {
			c.natsP.Stop(10 * time.Second)
		}
	})
	c.startNATS(t)
	for _, s := range []string{"ingest", "executor", "approver", "redriver"} {
		c.startStage(t, s)
	}
	return c
}

// startProc starts bin/name with args, logging to a fresh file.
func (c *cluster) startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	c.mu.Lock()
	c.seq[name]++
	logPath := filepath.Join(c.logDir, fmt.Sprintf("%s-%d.log", name, c.seq[name]))
	c.mu.Unlock()
	bin := filepath.Join(c.bin, "tollgate") // each component is a tollgate subcommand
	if name == "nats-server" {
		bin = filepath.Join(c.bin, name)
	} else {
		args = append([]string{name}, args...)
	}
	p, err := childproc.Start(bin, c.dir, logPath, childproc.Env(), args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	if name != "nats-server" { // see newCluster
		c.top.Cleanup(func() { p.Stop(10 * time.Second) })
	}
	return p
}

// startNATS starts nats-server with JetStream on a free loopback port and
// connects the test's own client. A port taken between choosing and binding
// is retried with another.
func (c *cluster) startNATS(t *testing.T) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		p := c.startProc(t, "nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(c.dir, "jetstream"))
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ok := false
		jstest.EventuallyState(t, jstest.Wait, "nats-server accepts connections on "+addr, func() (bool, string) {
			if p.Exited() {
				return true, "exited"
			}
			conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
			if err != nil {
				return false, err.Error()
			}
			conn.Close()
			ok = true
			return true, ""
		})
		if ok {
			c.url, c.natsP = "nats://"+addr, p
			break
		}
		if attempt == 3 {
			t.Fatalf("nats-server exited at start (%v):\n%s", p.Err(), p.LogText())
		}
		t.Logf("nats-server exited at start (%v); retrying on another port", p.Err())
	}
	nc, err := nats.Connect(c.url, nats.Name("tollgate-e2e"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", c.url, err)
	}
	c.top.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c.nc, c.js = nc, js
	jstest.EventuallyState(t, jstest.Wait, "JetStream is ready", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// restartNATS SIGKILLs the nats-server and starts it again on the same port
// and store directory, then waits until JetStream answers again.
func (c *cluster) restartNATS(t *testing.T) {
	t.Helper()
	kill(t, c.natsP)
	addr := strings.TrimPrefix(c.url, "nats://")
	_, port, _ := net.SplitHostPort(addr)
	p := c.startProc(t, "nats-server", "-a", "127.0.0.1", "-p", port, "-js", "-sd", filepath.Join(c.dir, "jetstream"))
	c.natsP = p
	jstest.EventuallyState(t, jstest.LongWait, "JetStream is back after the restart", func() (bool, string) {
		if p.Exited() {
			t.Fatalf("restarted nats-server exited (%v):\n%s", p.Err(), p.LogText())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.js.AccountInfo(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// startStage starts one stage binary with its own metrics port and waits
// until its consumer is running. A metrics port taken meanwhile is retried.
func (c *cluster) startStage(t *testing.T, stage string, extra ...string) *proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		maddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		p := c.startProc(t, stage, append([]string{"--nats", c.url, "--metrics", maddr, "--sandbox", c.sbox, "--log-level", "debug", "--seal-keys", c.keys}, extra...)...)
		ready := false
		jstest.EventuallyState(t, jstest.LongWait, stage+" is consuming", func() (bool, string) {
			if p.Exited() {
				return true, ""
			}
			ready = strings.Contains(p.LogText(), `msg="stage consuming"`)
			return ready, "no 'stage consuming' line yet"
		})
		if ready {
			c.mu.Lock()
			c.stages[stage], c.metrics[stage] = p, maddr
			c.mu.Unlock()
			return p
		}
		text := p.LogText()
		if attempt == 3 || !strings.Contains(text, "address already in use") {
			t.Fatalf("%s exited at start (%v):\n%s", stage, p.Err(), text)
		}
		t.Logf("%s: metrics port taken; retrying", stage)
	}
}

func (c *cluster) stage(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stages[name]
}

// dumpLogs logs every process's output if the test failed, and fails the
// test if any process reported a data race or a panic.
func (c *cluster) dumpLogs() {
	c.mu.Lock()
	procs := append([]*proc(nil), c.procs...)
	c.mu.Unlock()
	for _, p := range procs {
		text := p.LogText()
		if strings.Contains(text, "WARNING: DATA RACE") || strings.Contains(text, "panic:") {
			c.top.Errorf("%s reported a data race or panic", p.Name)
		}
	}
	if !c.top.Failed() {
		return
	}
	for _, p := range procs {
		state := "running at the end of the test"
		if p.Exited() {
			state = fmt.Sprintf("exited: %v", p.Err())
		}
		c.top.Logf("===== %s (%s) =====\n%s", p.Name, state, tail(p.LogText(), 300))
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) <= lines {
		return s
	}
	return fmt.Sprintf("[... %d lines ...]\n%s", len(parts)-lines, strings.Join(parts[len(parts)-lines:], "\n"))
}

// allLogs concatenates the logs of every process started so far.
func (c *cluster) allLogs() string {
	c.mu.Lock()
	procs := append([]*proc(nil), c.procs...)
	c.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		b.WriteString(p.LogText())
	}
	return b.String()
}

// toolRuns counts the "tool ran" log lines of a call across every process
// (a debug line: the stages run at --log-level debug):
// how many times the tool was actually invoked.
func (c *cluster) toolRuns(callID string) int {
	return strings.Count(c.allLogs(), `msg="tool ran" call=`+callID+" ")
}

// cliResult is one run of the tollgate CLI.
type cliResult struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("tollgate %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// runCLI runs the tollgate binary against the cluster's server.
func (c *cluster) runCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	args = append(args, "--nats", c.url)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "tollgate"), args...)
	cmd.Env = childproc.Env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cliResult{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("tollgate %s: did not finish: %v\n%s", strings.Join(args, " "), ctx.Err(), r)
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("tollgate %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// cliJSON runs the CLI, requires exit status want, and decodes its --json
// output into v.
func (c *cluster) cliJSON(t *testing.T, want int, v any, args ...string) cliResult {
	t.Helper()
	r := c.runCLI(t, append(args, "--json")...)
	if r.code != want {
		t.Fatalf("want exit status %d\n%s", want, r)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("decode --json output: %v\n%s", err, r)
	}
	return r
}

// metric returns the value of the sample of metric name whose label set
// contains every label in labels, from the stage's /metrics; found is false
// if there is no such sample.
func (c *cluster) metric(t *testing.T, stage, name string, labels ...string) (value float64, found bool, body string) {
	t.Helper()
	c.mu.Lock()
	addr := c.metrics[stage]
	c.mu.Unlock()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET %s /metrics: %v", stage, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s /metrics: status %d, %v", stage, resp.StatusCode, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		match := true
		for _, l := range labels {
			if !strings.Contains(line[:sp], l) {
				match = false
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v, true, string(b)
	}
	return 0, false, string(b)
}

// streamCount is how many messages of stream match subject filter.
func (c *cluster) streamCount(t *testing.T, stream, filter string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatalf("stream %s info: %v", stream, err)
	}
	var n uint64
	for _, k := range info.State.Subjects {
		n += k
	}
	return n
}

// waitIdle waits until a stage's durable consumer has nothing pending and
// nothing unacknowledged: whatever the stage was going to do, it has done.
func (c *cluster) waitIdle(t *testing.T, stream, consumer string) {
	t.Helper()
	jstest.EventuallyState(t, jstest.Wait, "consumer "+consumer+" idle", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return jstest.CaughtUp(ctx, c.js, stream, consumer)
	})
}

// watchEvents runs `tollgate watch --all --json --turn turn` and returns the
// first n events it prints.
func (c *cluster) watchEvents(t *testing.T, turn string, n int) []map[string]any {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "tollgate"), "watch", "--all", "--json", "--turn", turn, "--nats", c.url)
	cmd.Env = childproc.Env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tollgate watch: %v", err)
	}
	type res struct {
		evs []map[string]any
		err error
	}
	got := make(chan res, 1)
	go func() {
		dec := json.NewDecoder(stdout)
		var evs []map[string]any
		for len(evs) < n {
			var ev map[string]any
			if err := dec.Decode(&ev); err != nil {
				got <- res{evs, err}
				return
			}
			evs = append(evs, ev)
		}
		got <- res{evs, nil}
	}()
	var r res
	select {
	case r = <-got:
	case <-jstest.After(jstest.Wait):
		r.err = errors.New("timed out")
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	if r.err != nil {
		t.Fatalf("tollgate watch --turn %s: got %d of %d events: %v\nstderr: %s", turn, len(r.evs), n, r.err, stderr.String())
	}
	return r.evs
}

// nonce is a short random hex string that makes contents and paths unique.
func nonce(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// callArg renders a --call flag value: tool={json args}.
func callArg(t *testing.T, tool string, args map[string]string) string {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return tool + "=" + string(b)
}
