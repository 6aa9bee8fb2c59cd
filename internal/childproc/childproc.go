// Package childproc runs Tollgate's binaries as child processes for the
// harnesses that need real processes (e2e, internal/chaos, internal/bench):
// building them, starting one with its output in a log file, and stopping
// or killing it. It is for tests and tools, not for the product.
package childproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Proc is one run of a child process whose stdout and stderr go to a log
// file.
type Proc struct {
	Name string // the log file's base name, for messages
	Cmd  *exec.Cmd
	Log  string // the log file's path
	done chan struct{}
	err  error // Wait's result, valid once done is closed
}

// Start runs bin with args in dir under env, logging to logPath.
func Start(bin, dir, logPath string, env []string, args ...string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &Proc{Name: filepath.Base(logPath), Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is Wait's result; valid once Done is closed.
func (p *Proc) Err() error { return p.err }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// LogText returns what the process has logged so far.
func (p *Proc) LogText() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Stop sends SIGTERM, then SIGKILL if the process has not exited within
// grace, and returns once it has exited.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Kill sends SIGKILL and waits up to timeout for the process to be gone.
func (p *Proc) Kill(timeout time.Duration) error {
	if err := p.Cmd.Process.Kill(); err != nil && !p.Exited() {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit %v after SIGKILL", p.Name, timeout)
	}
}

// Env is this process's environment without TOLLGATE_* variables, so that
// only what a harness sets configures its children.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOLLGATE_") {
			env = append(env, kv)
		}
	}
	return env
}

// NATSServer is the package Build builds as dir/nats-server.
const NATSServer = "github.com/nats-io/nats-server/v2"

// Build builds the packages pkgs of this module (e.g. "./cmd/...") into
// dir, with the race detector if race, and nats-server into
// dir/nats-server. It runs the go command found on PATH (or in GOROOT) in
// the module's root directory.
func Build(ctx context.Context, dir string, race bool, pkgs ...string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return fmt.Errorf("not inside a module (GOMOD=%q)", gomod)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	for _, a := range [][]string{append(args, pkgs...), {"build", "-o", filepath.Join(dir, "nats-server"), NATSServer}} {
		cmd := exec.CommandContext(ctx, goBin, a...)
		cmd.Dir = filepath.Dir(gomod)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(a, " "), err, b)
		}
	}
	return nil
}

// EnvBin names a directory holding the binaries `make build` builds from
// this tree (tollgate, tollgate-bench, nats-server): `make test` builds
// them once and sets it, so that each harness does not build its own.
const EnvBin = "TOLLGATE_TEST_BIN"

// Binaries is the directory of the binaries a harness runs: $TOLLGATE_TEST_BIN
// when it is set, holds every one of want and race is off; otherwise dir,
// after building pkgs (and nats-server) into it with Build.
func Binaries(ctx context.Context, dir string, race bool, want []string, pkgs ...string) (string, error) {
	if pre := os.Getenv(EnvBin); pre != "" && !race {
		ok := true
		for _, b := range want {
			if _, err := os.Stat(filepath.Join(pre, b)); err != nil {
				ok = false
			}
		}
		if ok {
			return pre, nil
		}
	}
	if err := Build(ctx, dir, race, pkgs...); err != nil {
		return "", err
	}
	return dir, nil
}
