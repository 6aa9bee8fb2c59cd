package chaos

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/internal/childproc"
)

// toolServicePkg is the package of the ToolService binary.
const toolServicePkg = "./internal/chaos/" + ToolService

// BuildBinaries builds tollgate (which runs each stage and the planner as
// `tollgate <stage>`), the tool service and nats-server into dir.
func BuildBinaries(ctx context.Context, dir string, race bool) error {
	return childproc.Build(ctx, dir, race, "./cmd/tollgate", toolServicePkg)
}

// slot is one logical process (a stage replica or the broker) that is
// restarted whenever it exits: after the planned downtime when the harness
// killed it, after a short pause when it exited by itself (counted).
type slot struct {
	h    *harness
	name string // "executor-2", "nats-server"
	bin  string
	args func() []string

	mu         sync.Mutex
	cur        *childproc.Proc
	runs       int
	crashes    int           // planned crashes (toolsvc.CrashExit) of a tool service replica
	killed     bool          // the current process was killed by the harness
	down       time.Duration // downtime before the restart of a killed process
	stopping   bool
	unexpected []string      // exits the harness did not cause
	upCh       chan struct{} // closed while cur is running
}

func newSlot(h *harness, name, bin string, args ...string) *slot {
	return &slot{h: h, name: name, bin: bin, args: func() []string { return args }, upCh: make(chan struct{})}
}

// start runs a new process of the slot and makes it the current one,
// unless the slot is stopping.
func (s *slot) start() (*childproc.Proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, errStopping
	}
	s.runs++
	logPath := filepath.Join(s.h.logDir, fmt.Sprintf("%s.%d.log", s.name, s.runs))
	p, err := childproc.Start(s.h.binPath(s.bin), s.h.dir, logPath, s.h.procEnv(s.bin), append(s.h.binArgs(s.bin), s.args()...)...)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	s.h.addProc(p)
	s.cur = p
	close(s.upCh)
	return p, nil
}

var errStopping = errors.New("stopping")

// supervise restarts the slot's process whenever it exits, until stop: a
// process the harness killed after its planned downtime, a tool service
// replica's planned crash (a crash call) and one that exited by itself
// (counted) after a short pause. p is the current process.
func (s *slot) supervise(p *childproc.Proc) {
	for {
		<-p.Done()
		crashed := s.bin == ToolService && p.Cmd.ProcessState.ExitCode() == toolsvc.CrashExit
		s.mu.Lock()
		s.upCh = make(chan struct{})
		stopping, killed, down := s.stopping, s.killed, s.down
		s.killed = false
		switch {
		case stopping || killed:
		case crashed:
			s.crashes++
			down = 250 * time.Millisecond
		default:
			s.unexpected = append(s.unexpected, fmt.Sprintf("%s exited by itself (%v)", p.Name, p.Err()))
			down = 250 * time.Millisecond
		}
		s.mu.Unlock()
		switch {
		case stopping:
			return
		case crashed:
			s.h.logf("%s exited after a crash call, as planned; restarting", p.Name)
		case !killed:
			s.h.logf("%s exited by itself (%v); restarting", p.Name, p.Err())
		}
		time.Sleep(down)
		for {
			np, err := s.start()
			if errors.Is(err, errStopping) {
				return
			}
			if err == nil {
				p = np
				break
			}
			s.h.logf("%v; retrying", err)
			time.Sleep(time.Second)
		}
	}
}

// waitUp waits until the slot has a running process.
func (s *slot) waitUp(ctx context.Context) (*childproc.Proc, error) {
	for {
		s.mu.Lock()
		ch := s.upCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("%s is not up: %w", s.name, ctx.Err())
		}
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p != nil && !p.Exited() {
			return p, nil
		}
		select { // exited; its supervisor is about to replace upCh
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, fmt.Errorf("%s is not up: %w", s.name, ctx.Err())
		}
	}
}

// kill SIGKILLs the slot's running process and waits for it to be gone; the
// supervisor restarts it after down.
func (s *slot) kill(ctx context.Context, down time.Duration) error {
	p, err := s.waitUp(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.killed, s.down = true, down
	s.mu.Unlock()
	return p.Kill(10 * time.Second)
}

// killNow SIGKILLs the slot's current process without waiting for it to
// be gone (kill waits); the supervisor restarts it after down.
func (s *slot) killNow(down time.Duration) error {
	s.mu.Lock()
	p := s.cur
	if p == nil || p.Exited() {
		s.mu.Unlock()
		return fmt.Errorf("%s is not running", s.name)
	}
	s.killed, s.down = true, down
	s.mu.Unlock()
	return p.Cmd.Process.Kill()
}

// stop ends the slot: SIGTERM, then SIGKILL after grace.
func (s *slot) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	p := s.cur
	s.mu.Unlock()
	if p != nil {
		p.Stop(grace)
	}
}

func (s *slot) plannedCrashes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}

func (s *slot) unexpectedExits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.unexpected...)
}

// writeSealKey writes a TurnContext seal key file in the format the seal
// (being added on main) reads from TOLLGATE_SEAL_KEY_FILE. Stages that do
// not know the variable ignore it.
func writeSealKey(path string) error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	b, err := json.Marshal(map[string]any{"current": "k1", "keys": map[string]string{"k1": base64.StdEncoding.EncodeToString(key)}})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// binPath is the path of the binary that runs bin: tollgate for a stage.
func (h *harness) binPath(bin string) string {
	switch bin {
	case ToolService:
		return h.toolBin
	case "nats-server":
		return filepath.Join(h.binDir, bin)
	}
	return filepath.Join(h.binDir, "tollgate")
}

// binArgs are the arguments before bin's own: the stage's name for
// tollgate.
func (h *harness) binArgs(bin string) []string {
	if bin == ToolService || bin == "nats-server" {
		return nil
	}
	return []string{bin}
}

// procEnv is the environment of a child process: the one place where the
// stages' configuration is set (add new stage settings here). The tool
// service reads TOLLGATE_NATS_URL and TOLLGATE_LEDGER.
func (h *harness) procEnv(bin string) []string {
	env := childproc.Env()
	switch bin {
	case "nats-server":
		return env
	case "ingest":
		env = append(env, "TOLLGATE_PLAN="+strconv.FormatBool(h.cfg.Planner))
	case PlannerStage:
		env = append(env, "TOLLGATE_LLM_URL="+h.modelURL, "TOLLGATE_LLM_MODEL=scripted")
	}
	if h.cfg.ClaimLease > 0 {
		env = append(env, "TOLLGATE_CLAIM_LEASE="+h.cfg.ClaimLease.String())
	}
	if h.cfg.ToolTimeout > 0 {
		env = append(env, "TOLLGATE_TOOL_TIMEOUT="+h.cfg.ToolTimeout.String())
	}
	return append(env,
		"TOLLGATE_NATS_URL="+h.url, // every node's URL in a cluster
		"TOLLGATE_REPLICAS="+itoa(h.cfg.StreamReplicas),
		"TOLLGATE_POLICY="+h.policyPath,
		"TOLLGATE_SANDBOX="+filepath.Join(h.dir, "sandbox"),
		"TOLLGATE_LEDGER="+h.ledgerPath,
		"TOLLGATE_SEAL_KEY_FILE="+h.sealKeyPath,
		"TOLLGATE_METRICS_ADDR=", // no metrics listener: nothing to collide on
		"TOLLGATE_LOG_LEVEL=info",
	)
}

// waitTCP waits until addr accepts connections or p exits.
func waitTCP(ctx context.Context, addr string, p *childproc.Proc) error {
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited (%v)", p.Name, p.Err())
		}
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not accept connections on %s: %w", p.Name, addr, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// waitLog waits until p's log contains s.
func waitLog(ctx context.Context, p *childproc.Proc, s string) error {
	for {
		if strings.Contains(p.LogText(), s) {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited (%v) before logging %q:\n%s", p.Name, p.Err(), s, tail(p.LogText(), 40))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s has not logged %q: %w", p.Name, s, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) <= lines {
		return strings.Join(parts, "\n")
	}
	return strings.Join(parts[len(parts)-lines:], "\n")
}

func itoa(n int) string { return strconv.Itoa(n) }
