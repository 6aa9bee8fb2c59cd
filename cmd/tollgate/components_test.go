package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
)

// thinMains are the components' own binaries (cmd/<name>), the same code
// as `tollgate <name>`.
var thinMains = []string{"ingest", "executor", "approver", "redriver", "planner", "gateway", "slack", "discord"}

// runBinary runs bin with args and env (over a TOLLGATE_*-free
// environment), bounded by a deadline that a process which went on past
// its flags would run into, and returns its exit status and output.
func runBinary(t *testing.T, env []string, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(childproc.Env(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v (env %v) was still running after its flags; stderr:\n%s", filepath.Base(bin), args, env, errOut.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s: %v", bin, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// Every component runs from the one binary and from its own: --help
// prints its help on stdout with exit status 0, and a TOLLGATE_* variable
// its flags cannot read is refused with exit status 2 and a message that
// names it, before anything starts (the NATS URL is unreachable: a
// process that went on would wait for the broker).
func TestComponentsRefuseMalformedEnvironmentAndHelpExitsZero(t *testing.T) {
	dir, err := childproc.Binaries(context.Background(), t.TempDir(), false, []string{"tollgate"}, "./cmd/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := make([]string, len(thinMains))
	for i, m := range thinMains {
		pkgs[i] = "./cmd/" + m
	}
	// make build-all's (TOLLGATE_TEST_BIN), else built here.
	thin, err := childproc.Binaries(context.Background(), t.TempDir(), false, thinMains, pkgs...)
	if err != nil {
		t.Fatal(err)
	}
	// Each component, with a variable that every one of them reads
	// (TOLLGATE_LOG_LEVEL) and those only some of them read.
	bad := map[string][]string{
		"ingest":   {"TOLLGATE_NO_PROVISION=yes", "TOLLGATE_PLAN=on", "TOLLGATE_CLAIM_LEASE=90", "TOLLGATE_REPLICAS=three"},
		"executor": {"TOLLGATE_CLAIM_LEASE=90", "TOLLGATE_TOOL_TIMEOUT=1", "TOLLGATE_TOOL_SERVICES=yes", "TOLLGATE_RETENTION=30d"},
		"approver": {"TOLLGATE_NO_PROVISION=yes", "TOLLGATE_REPLICAS=3x"},
		"redriver": {"TOLLGATE_CLAIM_LEASE=2 minutes"},
		"planner":  {"TOLLGATE_LLM_MAX_STEPS=many", "TOLLGATE_LLM_MAX_TOKENS=1e5", "TOLLGATE_LLM_TIMEOUT=120", "TOLLGATE_LLM_MAX_WALL=1d"},
		"gateway":  nil,
		"slack":    nil,
		"discord":  nil,
	}
	for _, name := range thinMains {
		for _, inv := range [][]string{{filepath.Join(dir, "tollgate"), name}, {filepath.Join(thin, name)}} {
			prog := strings.Join(append([]string{filepath.Base(inv[0])}, inv[1:]...), " ")
			t.Run(prog, func(t *testing.T) {
				code, out, errOut := runBinary(t, nil, inv[0], append(inv[1:], "--help")...)
				if code != 0 || errOut != "" || !strings.Contains(out, "usage: "+prog) || !strings.Contains(out, "-log-level") {
					t.Fatalf("--help: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
				}
				for _, kv := range append(bad[name], "TOLLGATE_LOG_LEVEL=verbose") {
					code, _, errOut := runBinary(t, []string{kv, "TOLLGATE_NATS_URL=nats://127.0.0.1:1"}, inv[0], inv[1:]...)
					variable := kv[:strings.Index(kv, "=")]
					if code != 2 || !strings.Contains(errOut, variable) {
						t.Errorf("%s: exit %d, stderr %q; want 2 and the variable named", kv, code, errOut)
					}
				}
			})
		}
	}
}

// The operator commands that read a typed variable refuse a malformed one
// the same way.
func TestCommandsRefuseMalformedEnvironment(t *testing.T) {
	for _, args := range [][]string{{"provision", "--dry-run"}, {"replay", "--dry-run"}, {"dev"}} {
		t.Run(args[0], func(t *testing.T) {
			t.Setenv("TOLLGATE_REPLICAS", "three")
			code, _, errOut := runCLI(t, args...)
			if code != 2 || !strings.Contains(errOut, `TOLLGATE_REPLICAS="three"`) {
				t.Fatalf("exit %d, stderr %q; want 2 naming TOLLGATE_REPLICAS", code, errOut)
			}
		})
	}
}
