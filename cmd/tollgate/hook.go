package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

var hookCmd = &command{
	name:    "hook",
	args:    "[install [--dir DIR]]",
	summary: "Claude Code's PreToolUse command hook: ask the gateway, print its decision, deny on any error; install writes it into .claude/settings.json",
	example: "tollgate hook install --dir . --url http://127.0.0.1:8080 --key-file .tollgate/hook-key",
	run:     cmdHook,
}

// hookMatcher is the Claude Code tools the installed hook gates: those of
// Claude Code 2.1 (its tools reference) that change something, reach out
// or start a subagent (docs/api.md, "Claude Code hooks"). Agent is the
// subagent tool once called Task; MultiEdit is no longer offered. An exact
// list, so "Write" does not also match TodoWrite. MCP tools
// (mcp__<server>__<tool>) are gated too when the matcher names them: the
// gateway gives every tool name a gate.
const hookMatcher = "Bash|PowerShell|Edit|Write|NotebookEdit|WebFetch|WebSearch|Agent"

// hookClient is the hook's HTTP client. It follows no redirect (a 3xx is
// an answer other than 200: a deny) and uses no proxy from the
// environment, so the Bearer key goes to the --url given and nowhere
// else.
var hookClient = &http.Client{
	Transport: func() http.RoundTripper {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		return t
	}(),
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// hookTimeout is the hook's timeout in Claude Code (seconds), and
// hookWaitDefault the wait the hook asks the gateway for: the margin
// leaves time for the answer to come back.
const (
	hookTimeout     = 600
	hookWaitDefault = 570 * time.Second
)

// cmdHook is `tollgate hook` (the command hook: Claude Code runs it with
// the hook input on stdin) and `tollgate hook install`.
//
// The hook posts its stdin to the gateway's POST /v1/hooks/pretooluse and
// prints the gateway's decision in Claude Code's hook output format
// (hookSpecificOutput.permissionDecision allow or deny), exit status 0. It
// fails closed: when the gateway cannot be reached, does not answer within
// --wait plus a margin, answers anything but 200 with a PreToolUse decision
// of allow or deny, or the key cannot be read, it prints a deny naming the
// failure and exits 2, which Claude Code takes as "block the tool" (the
// reason on stderr). It calls --url only: no redirect is followed and no
// proxy variable is honoured (hookClient).
func cmdHook(cmd *command, args []string) int {
	if len(args) > 0 && args[0] == "install" {
		return cmdHookInstall(cmd, args[1:])
	}
	fs := cmd.flags()
	url := fs.String("url", scaffold.Env("TOLLGATE_GATEWAY_URL", "http://127.0.0.1:8080"), "the gateway's base URL (env TOLLGATE_GATEWAY_URL)")
	keyFile := fs.String("key-file", "", "file holding the gateway API key (scope submit); default: env TOLLGATE_KEY")
	wait := fs.Duration("wait", hookWaitDefault, "how long the gateway waits for a decision (below the hook's timeout in Claude Code)")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		if exit == 0 { // -h printed the help
			return 0
		}
		return denyHook(errors.New("bad arguments"))
	}
	if len(pos) > 0 {
		return denyHook(fmt.Errorf("unexpected arguments %q", pos))
	}
	key := os.Getenv("TOLLGATE_KEY")
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return denyHook(fmt.Errorf("reading the key: %w", err))
		}
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		return denyHook(errors.New("no gateway key: set TOLLGATE_KEY or give --key-file"))
	}
	in, err := io.ReadAll(io.LimitReader(os.Stdin, 4<<20))
	if err != nil {
		return denyHook(fmt.Errorf("reading the hook input: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *wait+20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*url, "/")+"/v1/hooks/pretooluse?wait="+wait.String(), bytes.NewReader(in))
	if err != nil {
		return denyHook(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hookClient.Do(req)
	if err != nil {
		return denyHook(fmt.Errorf("the gateway did not answer: %w", err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return denyHook(fmt.Errorf("reading the gateway's answer: %w", err))
	}
	if resp.StatusCode != http.StatusOK {
		return denyHook(fmt.Errorf("the gateway answered %s: %s", resp.Status, clip(strings.TrimSpace(string(body)), 300)))
	}
	var out gateway.HookOutput
	if err := json.Unmarshal(body, &out); err != nil {
		return denyHook(fmt.Errorf("the gateway's answer is not a hook decision: %w", err))
	}
	d := out.HookSpecificOutput
	if d.HookEventName != "PreToolUse" || d.PermissionDecision != "allow" && d.PermissionDecision != "deny" {
		return denyHook(fmt.Errorf("the gateway's answer is not a PreToolUse allow or deny: %s", clip(string(body), 300)))
	}
	printHookOutput(d)
	return 0
}

// denyHook prints a deny for err on stdout and the reason on stderr, and
// returns 2: Claude Code blocks the tool on exit status 2 whatever stdout
// holds.
func denyHook(err error) int {
	reason := "Tollgate hook failed, so the tool is denied: " + err.Error()
	printHookOutput(gateway.HookDecision{HookEventName: "PreToolUse", PermissionDecision: "deny", PermissionDecisionReason: reason})
	fmt.Fprintln(os.Stderr, reason)
	return 2
}

func printHookOutput(d gateway.HookDecision) {
	b, _ := json.Marshal(gateway.HookOutput{HookSpecificOutput: d})
	fmt.Println(string(b))
}

// cmdHookInstall writes the command hook into <dir>/.claude/settings.json:
// one PreToolUse entry whose command runs `tollgate hook`, merged into
// what the file holds (every other setting and hook kept). Installing
// again replaces the entry it wrote before (found by its command), so the
// file holds it once. A file that is not a JSON object is left alone and
// the install fails; a settings.json that is a symbolic link is written
// through the link. It warns (on stderr; the install still happens) when
// the key in --key-file is one the keys file (--keys) gives scope decide:
// the hook needs only submit, and a key that may decide is more than an
// agent's machine should hold.
func cmdHookInstall(cmd *command, args []string) int {
	fs := cmd.flags()
	dir := fs.String("dir", ".", "the project directory (its .claude/settings.json)")
	url := fs.String("url", "http://127.0.0.1:8080", "the gateway's base URL the hook calls")
	keyFile := fs.String("key-file", "", "file the hook reads the gateway key from (absolute, or relative to where Claude Code runs); empty: the hook reads env TOLLGATE_KEY")
	bin := fs.String("tollgate", "tollgate", "the tollgate command the hook runs (a path when tollgate is not on Claude Code's PATH)")
	keys := fs.String("keys", filepath.Join(scaffold.Env("TOLLGATE_DATA", "./.tollgate"), devKeysFile), "the gateway's keys file, to check the scopes of the key in --key-file")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 {
		return cmd.usageError("install takes no arguments, got %q", pos)
	}
	command := shellQuote(*bin) + " hook --url " + shellQuote(*url)
	if *keyFile != "" {
		command += " --key-file " + shellQuote(*keyFile)
	}
	path := filepath.Join(*dir, ".claude", "settings.json")
	changed, err := installHook(path, command)
	if err != nil {
		return fail("hook install: %v", err)
	}
	if changed {
		fmt.Printf("installed the Tollgate PreToolUse hook in %s:\n  %s\n", path, command)
	} else {
		fmt.Printf("%s already has the Tollgate PreToolUse hook\n", path)
	}
	if *keyFile != "" {
		if k := keyOf(*keyFile, *keys); k != nil && k.Allows(gateway.ScopeDecide) {
			fmt.Fprintf(os.Stderr, "warning: the hook's key %s (%s) has scope decide: the hook needs only submit, and an agent's machine should not hold a key that may decide; create one with 'tollgate gateway newkey --transport %s --scopes submit' (docs/api.md, \"Claude Code hooks\")\n", k.ID, *keyFile, k.Transport)
		}
	}
	return 0
}

// keyOf returns the key of keysPath whose token tokenPath holds, or nil
// when either cannot be read or the keys file does not list it (nothing to
// check against).
func keyOf(tokenPath, keysPath string) *gateway.Key {
	b, err := os.ReadFile(tokenPath)
	if err != nil {
		return nil
	}
	keys, err := gateway.LoadKeys(keysPath)
	if err != nil {
		return nil
	}
	hash := gateway.HashToken(strings.TrimSpace(string(b)))
	for i := range keys {
		if keys[i].Hash == hash {
			return &keys[i]
		}
	}
	return nil
}

// installHook merges the hook entry running command into the settings
// file at path and reports whether the file changed.
func installHook(path, command string) (bool, error) {
	// A symbolic link (settings kept in a dotfiles repository) is written
	// through: its target is the file, and the link stays.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			return false, fmt.Errorf("%s is a symbolic link whose target cannot be read, left as it is: %w", path, err)
		}
		path = target
	}
	settings := map[string]any{}
	old, err := os.ReadFile(path)
	mode := os.FileMode(0o644)
	switch {
	case err == nil:
		if err := json.Unmarshal(old, &settings); err != nil || settings == nil {
			return false, fmt.Errorf("%s is not a JSON object, left as it is: %v", path, err)
		}
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	case !errors.Is(err, os.ErrNotExist):
		return false, err
	}
	hooks, _ := settings["hooks"].(map[string]any)
	if hooks == nil {
		if settings["hooks"] != nil {
			return false, fmt.Errorf("%s: \"hooks\" is not an object, left as it is", path)
		}
		hooks = map[string]any{}
	}
	entries, _ := hooks["PreToolUse"].([]any)
	if hooks["PreToolUse"] != nil && entries == nil {
		return false, fmt.Errorf("%s: \"hooks.PreToolUse\" is not a list, left as it is", path)
	}
	ours := map[string]any{
		"matcher": hookMatcher,
		"hooks":   []any{map[string]any{"type": "command", "command": command, "timeout": hookTimeout}},
	}
	var kept []any
	for _, e := range entries {
		if !isTollgateHook(e) {
			kept = append(kept, e)
		}
	}
	hooks["PreToolUse"] = append(kept, ours)
	settings["hooks"] = hooks
	b, err := json.MarshalIndent(settings, "", "  ")
	if err != nil {
		return false, err
	}
	b = append(b, '\n')
	if bytes.Equal(b, old) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".settings-*.json")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), path)
}

// isTollgateHook reports whether a PreToolUse entry is one install wrote:
// a command hook running "tollgate hook" (any tollgate path).
func isTollgateHook(entry any) bool {
	e, _ := entry.(map[string]any)
	hs, _ := e["hooks"].([]any)
	for _, h := range hs {
		m, _ := h.(map[string]any)
		c, _ := m["command"].(string)
		if m["type"] == "command" && strings.Contains(c, " hook --url ") && strings.Contains(c, "tollgate") {
			return true
		}
	}
	return false
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
