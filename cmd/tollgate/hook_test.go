package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// tollgateBinary returns the tollgate binary: make build's
// (TOLLGATE_TEST_BIN), else this command built once per test run.
func tollgateBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-bin-")
		if err != nil {
			binErr = err
			return
		}
		dir, binErr = childproc.Binaries(context.Background(), dir, false, []string{"tollgate"}, "./cmd/tollgate")
		binPath = filepath.Join(dir, "tollgate")
	})
	if binErr != nil {
		t.Fatalf("build tollgate: %v", binErr)
	}
	return binPath
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

const hookTestPolicy = `{
  "version": "hook-cli-test",
  "default_approval": "required",
  "tools": {
    "claude.bash": {"approval": "never"},
    "claude.read": {"approval": "deny"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// `tollgate hook`, run as Claude Code runs a command hook (the input on
// stdin) against a real `tollgate dev`, prints the gateway's decision in
// Claude Code's format; on any failure (the gateway down, a wrong key) it
// prints a deny and exits 2.
func TestHookCommandPrintsTheDecisionAndFailsClosed(t *testing.T) {
	bin := tollgateBinary(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(pol, []byte(hookTestPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := freeLoopback(t)
	data := filepath.Join(dir, "data")
	dev, err := childproc.Start(bin, dir, filepath.Join(dir, "dev.log"), childproc.Env(),
		"dev", "--data", data, "--listen", freeLoopback(t), "--http", httpAddr, "--metrics", "", "--policy", pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("tollgate dev log:\n%s", dev.LogText())
		}
	})
	keyFile := filepath.Join(data, devTokenFile)
	// The executor finds the gateway's gate tools by discovery.
	jstest.Eventually(t, time.Minute, "the gate tools are found", func() bool {
		return strings.Contains(dev.LogText(), "claude.bash") || dev.Exited()
	})
	if dev.Exited() {
		t.Fatalf("tollgate dev exited: %v", dev.Err())
	}
	hook := func(url, key, input string) (code int, out gateway.HookOutput, stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(bin, "hook", "--url", url, "--key-file", key, "--wait", "5s")
		cmd.Env = childproc.Env()
		cmd.Stdin = strings.NewReader(input)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code = cmd.ProcessState.ExitCode()
		if err != nil && code <= 0 {
			t.Fatalf("run the hook: %v", err)
		}
		if err := json.Unmarshal(o.Bytes(), &out); err != nil {
			t.Fatalf("the hook printed %q, not a hook output (%v); stderr %q", o.String(), err, e.String())
		}
		return code, out, o.String(), e.String()
	}
	input := func(tool, id string) string {
		b, _ := json.Marshal(map[string]any{"session_id": "s1", "hook_event_name": "PreToolUse", "tool_name": tool,
			"tool_input": map[string]any{"command": "ls"}, "tool_use_id": id, "cwd": "/work"})
		return string(b)
	}
	url := "http://" + httpAddr

	code, out, _, errOut := hook(url, keyFile, input("Bash", "toolu_1"))
	if d := out.HookSpecificOutput; code != 0 || d.PermissionDecision != "allow" || d.HookEventName != "PreToolUse" {
		t.Fatalf("Bash (policy never): exit %d, %+v, stderr %q; want allow", code, d, errOut)
	}
	code, out, _, _ = hook(url, keyFile, input("Read", "toolu_2"))
	if d := out.HookSpecificOutput; code != 0 || d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, "POLICY_DENIED") {
		t.Fatalf("Read (policy deny): exit %d, %+v; want deny POLICY_DENIED", code, d)
	}
	wrongKey := filepath.Join(dir, "wrong-key")
	if err := os.WriteFile(wrongKey, []byte("tg_nope_nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, url, key, says string }{
		{"the gateway down", "http://" + freeLoopback(t), keyFile, "did not answer"},
		{"a wrong key", url, wrongKey, "401"},
		{"no key file", url, filepath.Join(dir, "missing"), "reading the key"},
	} {
		code, out, _, errOut := hook(tc.url, tc.key, input("Bash", "toolu_3"))
		if d := out.HookSpecificOutput; code != 2 || d.PermissionDecision != "deny" || !strings.Contains(d.PermissionDecisionReason, tc.says) || !strings.Contains(errOut, tc.says) {
			t.Fatalf("%s: exit %d, %+v, stderr %q; want exit 2 and a deny saying %q", tc.name, code, d, errOut, tc.says)
		}
	}
}

// `tollgate hook install` merges the hook into .claude/settings.json,
// keeping every other setting and hook, and installing again changes
// nothing; a file that is not JSON is left alone.
func TestHookInstallMergesAndIsIdempotent(t *testing.T) {
	bin := tollgateBinary(t)
	proj := t.TempDir()
	settings := filepath.Join(proj, ".claude", "settings.json")
	if err := os.MkdirAll(filepath.Dir(settings), 0o755); err != nil {
		t.Fatal(err)
	}
	before := `{"model": "opus", "permissions": {"allow": ["Read"]},
  "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "echo mine"}]}],
            "PostToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": "make fmt"}]}]}}`
	if err := os.WriteFile(settings, []byte(before), 0o600); err != nil {
		t.Fatal(err)
	}
	install := func() (int, string) {
		out, err := exec.Command(bin, "hook", "install", "--dir", proj, "--url", "http://127.0.0.1:8080", "--key-file", ".tollgate/gateway-dev-key").CombinedOutput()
		code := 0
		if err != nil {
			code = err.(*exec.ExitError).ExitCode()
		}
		return code, string(out)
	}
	if code, out := install(); code != 0 || !strings.Contains(out, "installed") {
		t.Fatalf("install: exit %d: %s", code, out)
	}
	first, _ := os.ReadFile(settings)
	var got struct {
		Model       string         `json:"model"`
		Permissions map[string]any `json:"permissions"`
		Hooks       map[string][]struct {
			Matcher string `json:"matcher"`
			Hooks   []struct {
				Type, Command string
				Timeout       int
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(first, &got); err != nil {
		t.Fatalf("%v:\n%s", err, first)
	}
	pre := got.Hooks["PreToolUse"]
	if got.Model != "opus" || got.Permissions["allow"] == nil || len(got.Hooks["PostToolUse"]) != 1 || len(pre) != 2 ||
		pre[0].Hooks[0].Command != "echo mine" || pre[1].Matcher != hookMatcher ||
		pre[1].Hooks[0].Command != "tollgate hook --url http://127.0.0.1:8080 --key-file .tollgate/gateway-dev-key" || pre[1].Hooks[0].Timeout != hookTimeout {
		t.Fatalf("settings after install:\n%s", first)
	}
	if fi, _ := os.Stat(settings); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want the file's own 0600 kept", fi.Mode().Perm())
	}
	if code, out := install(); code != 0 || !strings.Contains(out, "already") {
		t.Fatalf("second install: exit %d: %s", code, out)
	}
	if again, _ := os.ReadFile(settings); !bytes.Equal(again, first) {
		t.Fatalf("a second install changed the file:\n%s", again)
	}

	if err := os.WriteFile(settings, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := install(); code != 1 || !strings.Contains(out, "not a JSON object") {
		t.Fatalf("install over a broken file: exit %d: %s", code, out)
	}
	if b, _ := os.ReadFile(settings); string(b) != "{not json" {
		t.Fatalf("the broken file was changed: %s", b)
	}

	// A project without settings gets a file with the hook alone.
	fresh := t.TempDir()
	if code, out := install2(bin, fresh); code != 0 {
		t.Fatalf("install in a fresh project: exit %d: %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(fresh, ".claude", "settings.json")); err != nil || !strings.Contains(string(b), "tollgate hook --url") {
		t.Fatalf("fresh settings: %v\n%s", err, b)
	}
}

func install2(bin, dir string) (int, string) {
	out, err := exec.Command(bin, "hook", "install", "--dir", dir).CombinedOutput()
	if err != nil {
		return err.(*exec.ExitError).ExitCode(), string(out)
	}
	return 0, string(out)
}
