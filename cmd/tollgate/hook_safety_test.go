package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/transport/gateway"
)

const hookInput = `{"session_id":"s","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"tool_use_id":"toolu_1"}`

// allowServer is a loopback HTTP server that answers every request with a
// PreToolUse allow and counts the requests that carried an Authorization
// header.
func allowServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var authorized atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			authorized.Add(1)
		}
		_ = json.NewEncoder(w).Encode(gateway.HookOutput{HookSpecificOutput: gateway.HookDecision{
			HookEventName: "PreToolUse", PermissionDecision: "allow", PermissionDecisionReason: "from " + r.Host}})
	}))
	t.Cleanup(srv.Close)
	return srv, &authorized
}

// runHook runs `tollgate hook --url url --wait 2s` with the hook input on
// stdin and env added, and returns its exit status, decision and stderr.
func runHook(t *testing.T, url string, env ...string) (int, gateway.HookDecision, string) {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t), "hook", "--url", url, "--wait", "2s")
	cmd.Stdin = strings.NewReader(hookInput)
	cmd.Env = append(os.Environ(), append([]string{"TOLLGATE_KEY=tg_000000000000_secret", "NO_PROXY=", "no_proxy="}, env...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	var out gateway.HookOutput
	if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil {
		t.Fatalf("hook output %q: %v (stderr %q)", stdout.String(), err, stderr.String())
	}
	return code, out.HookSpecificOutput, stderr.String()
}

// The hook sends its Bearer key to --url and nowhere else: a gateway
// address answering 307 to another local listener (which would allow)
// is a deny, and that listener never sees the key; with HTTP_PROXY and
// HTTPS_PROXY naming a listener, the hook still calls --url directly
// (LOCALHOST, which /etc/hosts resolves to the loopback address but Go's
// proxy rules, comparing with "localhost" exactly, do not exempt as they
// do localhost and loopback addresses) and the proxy sees nothing.
func TestHookSendsItsKeyOnlyToItsURL(t *testing.T) {
	t.Run("a redirect is not followed", func(t *testing.T) {
		other, authorized := allowServer(t)
		redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
		}))
		defer redirect.Close()
		code, d, errOut := runHook(t, redirect.URL)
		if code != 2 || d.PermissionDecision != "deny" || !strings.Contains(errOut, "307") {
			t.Fatalf("exit %d, %+v, stderr %q; want exit 2 and a deny naming the 307", code, d, errOut)
		}
		if n := authorized.Load(); n != 0 {
			t.Fatalf("the redirect's target got the key %d times", n)
		}
	})
	t.Run("proxy variables are not honoured", func(t *testing.T) {
		gw, _ := allowServer(t)
		proxy, proxied := allowServer(t)
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(gw.URL, "http://"))
		code, d, errOut := runHook(t, fmt.Sprintf("http://LOCALHOST:%s", port),
			"HTTP_PROXY="+proxy.URL, "http_proxy="+proxy.URL, "HTTPS_PROXY="+proxy.URL, "https_proxy="+proxy.URL)
		if code != 0 || d.PermissionDecision != "allow" {
			t.Fatalf("exit %d, %+v, stderr %q; want the gateway's allow", code, d, errOut)
		}
		if n := proxied.Load(); n != 0 {
			t.Fatalf("the proxy got the key %d times", n)
		}
	})
}

// installIn runs `tollgate hook install` for project dir with args added
// and returns its exit status, stdout and stderr.
func installIn(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t), append([]string{"hook", "install", "--dir", dir, "--url", "http://127.0.0.1:8080"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return err.(*exec.ExitError).ExitCode(), stdout.String(), stderr.String()
	}
	return 0, stdout.String(), stderr.String()
}

// `tollgate hook install` writes through a settings.json that is a
// symbolic link (settings kept elsewhere): the link stays a link, and its
// target gets the hook with its own settings kept.
func TestHookInstallWritesThroughASymlink(t *testing.T) {
	proj, dotfiles := t.TempDir(), t.TempDir()
	target := filepath.Join(dotfiles, "claude-settings.json")
	if err := os.WriteFile(target, []byte(`{"model": "opus"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(proj, ".claude", "settings.json")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := installIn(t, proj); code != 0 {
		t.Fatalf("install: exit %d: %s %s", code, out, errOut)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("settings.json is no longer a symbolic link: %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(target)
	if !strings.Contains(string(b), "tollgate hook --url") || !strings.Contains(string(b), `"opus"`) {
		t.Fatalf("the link's target after install:\n%s", b)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Errorf("target mode %v, want its own 0600 kept", fi.Mode().Perm())
	}
	// A link to nowhere is left as it is.
	dangling := t.TempDir()
	_ = os.MkdirAll(filepath.Join(dangling, ".claude"), 0o755)
	if err := os.Symlink(filepath.Join(dotfiles, "missing.json"), filepath.Join(dangling, ".claude", "settings.json")); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := installIn(t, dangling); code != 1 || !strings.Contains(errOut, "symbolic link") {
		t.Fatalf("install through a dangling link: exit %d, stderr %q; want exit 1", code, errOut)
	}
}

// `tollgate hook install` warns when the key file's key may decide (as the
// dev key may), and not for a submit-only key; it installs either way.
func TestHookInstallWarnsOfAKeyThatMayDecide(t *testing.T) {
	dir := t.TempDir()
	decideTok, decide := gateway.NewKey("gateway", []gateway.Scope{gateway.ScopeSubmit, gateway.ScopeRead, gateway.ScopeDecide}, true)
	submitTok, submit := gateway.NewKey("gateway", []gateway.Scope{gateway.ScopeSubmit}, true)
	keys, _ := json.Marshal(gateway.KeysFile{Keys: []gateway.Key{decide, submit}})
	keysPath := filepath.Join(dir, "gateway-keys.json")
	for path, content := range map[string]string{keysPath: string(keys), filepath.Join(dir, "dev-key"): decideTok + "\n", filepath.Join(dir, "hook-key"): submitTok + "\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, keyFile string
		warn          bool
	}{
		{"a key with scope decide", "dev-key", true},
		{"a submit-only key", "hook-key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := installIn(t, t.TempDir(), "--key-file", filepath.Join(dir, tc.keyFile), "--keys", keysPath)
			if code != 0 || !strings.Contains(out, "installed") {
				t.Fatalf("install: exit %d: %s %s", code, out, errOut)
			}
			warned := strings.Contains(errOut, "warning") && strings.Contains(errOut, "scope decide") && strings.Contains(errOut, decide.ID)
			if warned != tc.warn || (!tc.warn && errOut != "") {
				t.Fatalf("stderr %q: want a warning about scope decide: %v", errOut, tc.warn)
			}
		})
	}
}
