package mcptool_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

// wait bounds every poll of these tests.
const wait = jstest.Wait

// testServer is a stdio server served by this test binary in mode (see
// TestMain), recording its starts in a file of its own.
type testServer struct {
	mcptool.ServerConfig
	starts string
}

func newTestServer(t *testing.T, mode string, env ...string) testServer {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	starts := filepath.Join(t.TempDir(), "starts")
	sc := mcptool.ServerConfig{Command: self, Env: map[string]string{"MCPTEST_MODE": mode, "MCPTEST_STARTS": starts}}
	for i := 0; i+1 < len(env); i += 2 {
		sc.Env[env[i]] = env[i+1]
	}
	return testServer{ServerConfig: sc, starts: starts}
}

// start is one recorded start of a test server.
type start struct {
	pid int
	at  time.Time
}

// Starts returns the server's starts so far.
func (s testServer) Starts(t *testing.T) []start {
	t.Helper()
	b, err := os.ReadFile(s.starts)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []start
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue // a start being written
		}
		pid, _ := strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		out = append(out, start{pid: pid, at: time.Unix(0, ns)})
	}
	return out
}

// WaitStarts waits until the server has started at least n times.
func (s testServer) WaitStarts(t *testing.T, n int) []start {
	t.Helper()
	var got []start
	jstest.Eventually(t, wait, "server started "+strconv.Itoa(n)+" times", func() bool {
		got = s.Starts(t)
		return len(got) >= n
	})
	return got
}

// gone reports whether process pid no longer exists (it exited and was
// reaped).
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// testLogger discards logs unless TOLLGATE_TEST_LOG is set (then: stderr,
// debug), like pipelinetest.Logger.
func testLogger() *slog.Logger {
	if os.Getenv("TOLLGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fast are options that keep the tests short.
func fast() mcptool.Options {
	return mcptool.Options{
		Logger: testLogger(), ConnectTimeout: 10 * time.Second,
		RestartMin: 50 * time.Millisecond, RestartMax: 200 * time.Millisecond, StopGrace: 2 * time.Second,
	}
}

// run runs p until the test ends and checks that Run returns then.
func run(t *testing.T, p *mcptool.Provider) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-jstest.After(jstest.LongWait):
			t.Errorf("Run did not return after its context was cancelled")
		}
	})
}

// toolsByName returns p's current tools by name.
func toolsByName(t *testing.T, p *mcptool.Provider) map[string]tools.Tool {
	t.Helper()
	ts, err := p.Tools(context.Background())
	if err != nil {
		t.Fatalf("Tools: %v", err)
	}
	m := map[string]tools.Tool{}
	for _, tl := range ts {
		if _, dup := m[tl.Name()]; dup {
			t.Fatalf("tool %s listed twice", tl.Name())
		}
		m[tl.Name()] = tl
	}
	return m
}

// waitTool waits until p offers a tool called name and returns it.
func waitTool(t *testing.T, p *mcptool.Provider, name string) tools.Tool {
	t.Helper()
	var tl tools.Tool
	jstest.Eventually(t, wait, "tool "+name+" listed", func() bool {
		tl = toolsByName(t, p)[name]
		return tl != nil
	})
	return tl
}

// call runs tl with args under call id "c-1".
func call(t *testing.T, ctx context.Context, tl tools.Tool, args string) (string, error) {
	t.Helper()
	return tl.Run(ctx, tools.Call{Context: &schemas.TurnContext{}, CallID: "c-1", Args: args})
}

// wantKind checks err against what a failed call must be: "unavailable"
// (TOOL_UNAVAILABLE, ErrUnavailable), "uncertain:<CODE>" (ErrUncertain
// with CODE) or "error" (neither: the tool ran and failed).
func wantKind(t *testing.T, err error, kind string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %s", kind)
	}
	unavailable, uncertain, code := errors.Is(err, tools.ErrUnavailable), errors.Is(err, tools.ErrUncertain), schemas.CodeOf(err)
	var ok bool
	switch {
	case kind == "unavailable":
		ok = unavailable && !uncertain && code == schemas.CodeToolUnavailable
	case strings.HasPrefix(kind, "uncertain:"):
		ok = uncertain && !unavailable && string(code) == strings.TrimPrefix(kind, "uncertain:")
	default:
		ok = !uncertain && !unavailable
	}
	if !ok {
		t.Fatalf("error %q (unavailable %v, uncertain %v, code %q), want %s", err, unavailable, uncertain, code, kind)
	}
}

func TestStdioServerToolsAreNamedAndDescribed(t *testing.T) {
	srv := newTestServer(t, "tools")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	run(t, p)
	waitTool(t, p, "t.echo")

	var names []string
	for n := range toolsByName(t, p) {
		names = append(names, n)
	}
	slices.Sort(names)
	// "dup" and "DUP" are refused together, the 70-character name is too
	// long, "Fetch URL" is sanitized, and the server's "echo" is "t.echo":
	// it can never shadow the built-in echo.
	want := []string{"t.echo", "t.env", "t.exit", "t.fail", "t.fetch_url", "t.hang", "t.media", "t.meta", "t.traceparent"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	echo := tools.SpecOf(toolsByName(t, p)["t.echo"])
	var schema struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(echo.InputSchema, &schema); err != nil || schema.Properties["text"] == nil {
		t.Errorf("t.echo input schema %s (%v), want one with property text", echo.InputSchema, err)
	}
	if echo.Source != "mcp:t" || echo.Description != "Returns its text." || echo.RetrySafe {
		t.Errorf("t.echo spec %+v, want source mcp:t, the server's description, not retry-safe", echo)
	}
	if echo.Hints.ReadOnly == nil || !*echo.Hints.ReadOnly || echo.Hints.Destructive != nil {
		t.Errorf("t.echo hints %+v, want read-only and no destructive hint", echo.Hints)
	}
	fail := tools.SpecOf(toolsByName(t, p)["t.fail"])
	if fail.Hints.Destructive == nil || !*fail.Hints.Destructive || fail.Hints.ReadOnly == nil || *fail.Hints.ReadOnly {
		t.Errorf("t.fail hints %+v, want destructive and not read-only", fail.Hints)
	}
	if out, err := call(t, context.Background(), toolsByName(t, p)["t.fetch_url"], "{}"); err != nil || out != "Fetch URL" {
		t.Errorf("t.fetch_url ran %q (%v), want the server's tool \"Fetch URL\"", out, err)
	}
}

func TestStdioServerCalls(t *testing.T) {
	t.Setenv("TOLLGATE_SEAL_KEYS", `{"k1":"secret"}`)
	srv := newTestServer(t, "tools", "MCPTEST_PASSED", "passed on")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	run(t, p)
	waitTool(t, p, "t.echo")

	tests := []struct {
		name, tool, args string
		timeout          time.Duration
		want             string // the output, or the error's kind (see wantKind) after "!"
	}{
		{"text content is the output", "t.echo", `{"text":"hi there"}`, 0, "hi there"},
		{"other content is described", "t.media", `{}`, 0, "a\n[image image/png, 3 bytes]\n[resource link file:///x]\n[resource file:///y]\nbody"},
		{"the call id travels in _meta", "t.meta", `{}`, 0, "c-1"},
		{"a result with isError is an error", "t.fail", `{}`, 0, "!error"},
		{"the server gets the variables the tools file passes", "t.env", `{"name":"MCPTEST_PASSED"}`, 0, "passed on"},
		{"the server does not get Tollgate's secrets", "t.env", `{"name":"TOLLGATE_SEAL_KEYS"}`, 0, "<unset>"},
		{"no reply before the deadline is uncertain", "t.hang", `{}`, 300 * time.Millisecond, "!uncertain:EXECUTION_UNCERTAIN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			out, err := call(t, ctx, toolsByName(t, p)[tc.tool], tc.args)
			if kind, isErr := strings.CutPrefix(tc.want, "!"); isErr {
				wantKind(t, err, kind)
				return
			}
			if err != nil || out != tc.want {
				t.Fatalf("output %q (%v), want %q", out, err, tc.want)
			}
		})
	}
	if _, err := call(t, context.Background(), toolsByName(t, p)["t.fail"], "{}"); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("isError result: %v, want the server's text in the error", err)
	}
	if _, err := call(t, context.Background(), toolsByName(t, p)["t.env"], `{"name":"PATH"}`); err != nil {
		t.Errorf("env: %v", err)
	}
}

func TestStdioServerThatExitsIsRestarted(t *testing.T) {
	srv := newTestServer(t, "tools")
	o := fast()
	// Long enough for the calls right after the exit to find the server
	// down, short enough for a quick test.
	o.RestartMin = 2 * time.Second
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, o)
	run(t, p)
	echo, exit := waitTool(t, p, "t.echo"), waitTool(t, p, "t.exit")
	first := srv.WaitStarts(t, 1)[0]

	_, err := call(t, context.Background(), exit, "{}")
	wantKind(t, err, "uncertain:EXECUTION_UNCERTAIN") // it may have acted before it died
	_, err = call(t, context.Background(), echo, `{"text":"x"}`)
	wantKind(t, err, "unavailable") // nothing to send it to
	if toolsByName(t, p)["t.echo"] == nil {
		t.Fatal("a server that is down keeps its tools (calls get TOOL_UNAVAILABLE, not TOOL_NOT_FOUND)")
	}

	starts := srv.WaitStarts(t, 2)
	jstest.Eventually(t, wait, "t.echo answers again", func() bool {
		out, err := call(t, context.Background(), echo, `{"text":"back"}`)
		return err == nil && out == "back"
	})
	if starts[1].pid == first.pid || !gone(first.pid) {
		t.Errorf("starts %+v: want a new process and the old one gone", starts)
	}
}

func TestCrashingServerIsRestartedWithBackOff(t *testing.T) {
	srv := newTestServer(t, "crash")
	o := fast()
	// RestartMax is also how long a run must last to count as healthy and
	// reset the back-off. A crashing server's run is its start-up, which
	// under a loaded machine's race-built test binaries has taken over
	// 100ms, and once (load average 12) over a second: a run that long
	// resets the back-off to RestartMin, as it should, and the next start
	// came sooner than the doubling. RestartMax is scaled with the test
	// timeouts (jstest.Scale: 2 in CI) to keep the crashing runs short of
	// it, and so is the longest gap allowed.
	o.RestartMin, o.RestartMax = 25*time.Millisecond, jstest.Scale(time.Second)
	longest := jstest.Scale(3 * time.Second)
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"c": srv.ServerConfig}}, o)
	run(t, p)
	starts := srv.WaitStarts(t, 10)
	for i := 1; i < len(starts); i++ {
		gap := starts[i].at.Sub(starts[i-1].at)
		// Each wait doubles the last, up to RestartMax. Without the cap
		// the eighth and ninth waits would be 3.2s and 6.4s.
		if floor := min(o.RestartMin<<(i-1), o.RestartMax); gap < floor || gap > longest {
			t.Errorf("start %d came %v after the one before, want at least %v and at most %v", i, gap, floor, longest)
		}
	}
}

func TestToolsBeforeRunListsTheServersOnce(t *testing.T) {
	srv := newTestServer(t, "tools")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{
		"t":    srv.ServerConfig,
		"dead": {Command: srv.Command, Env: map[string]string{"MCPTEST_MODE": "crash"}},
	}}, fast())
	echo := toolsByName(t, p)["t.echo"]
	if echo == nil {
		t.Fatalf("tools before Run: %v, want the server's tools", toolsByName(t, p))
	}
	starts := srv.Starts(t)
	if len(starts) != 1 || !gone(starts[0].pid) {
		t.Fatalf("starts %+v: want one start, stopped again after the listing", starts)
	}
	toolsByName(t, p)
	if n := len(srv.Starts(t)); n != 1 {
		t.Fatalf("a second Tools started the server again (%d starts)", n)
	}

	// A call waits for Run's first connection, within its context.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := call(t, ctx, echo, `{"text":"x"}`)
	wantKind(t, err, "unavailable")
	type result struct {
		out string
		err error
	}
	early := make(chan result, 1)
	go func() {
		out, err := echo.Run(context.Background(), tools.Call{Context: &schemas.TurnContext{}, CallID: "c-2", Args: `{"text":"early"}`})
		early <- result{out, err}
	}()
	run(t, p)
	select {
	case r := <-early:
		if r.err != nil || r.out != "early" {
			t.Fatalf("a call made before Run: %q (%v), want it run once Run connected", r.out, r.err)
		}
	case <-jstest.After(wait):
		t.Fatal("a call made before Run still waits")
	}
}

func TestRunStopsTheServers(t *testing.T) {
	srv := newTestServer(t, "tools")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	echo := waitTool(t, p, "t.echo")
	if _, err := call(t, context.Background(), echo, `{"text":"x"}`); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-jstest.After(jstest.LongWait):
		t.Fatal("Run did not return after its context was cancelled")
	}
	starts := srv.Starts(t)
	for _, s := range starts {
		if !gone(s.pid) {
			t.Errorf("server process %d still runs after Run returned", s.pid)
		}
	}
	_, err := call(t, context.Background(), echo, `{"text":"x"}`)
	wantKind(t, err, "unavailable")
	if err := p.Run(context.Background()); err == nil {
		t.Error("a second Run: no error")
	}
}

func TestServerThatSendsGarbageIsContained(t *testing.T) {
	srv := newTestServer(t, "garbage")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"g": srv.ServerConfig}}, fast())
	run(t, p)
	ok, bad, noise := waitTool(t, p, "g.ok"), waitTool(t, p, "g.badresult"), waitTool(t, p, "g.noise")

	_, err := call(t, context.Background(), bad, "{}")
	wantKind(t, err, "uncertain:TOOL_REPLY_INVALID")
	if out, err := call(t, context.Background(), ok, "{}"); err != nil || out != "fine" {
		t.Fatalf("after a bad result the connection still serves: got %q (%v)", out, err)
	}
	_, err = call(t, context.Background(), noise, "{}")
	wantKind(t, err, "uncertain:TOOL_REPLY_INVALID")
	// Its output can no longer be read: the server is started again.
	srv.WaitStarts(t, 2)
	jstest.Eventually(t, wait, "g.ok answers after the restart", func() bool {
		out, err := call(t, context.Background(), ok, "{}")
		return err == nil && out == "fine"
	})
}

// lineCounter is a slog handler that counts the records of one message by
// level.
type lineCounter struct {
	mu     sync.Mutex
	msg    string
	levels map[slog.Level]int
}

func (c *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == c.msg {
		c.mu.Lock()
		c.levels[r.Level]++
		c.mu.Unlock()
	}
	return nil
}
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lineCounter) WithGroup(string) slog.Handler      { return c }

func (c *lineCounter) count(l slog.Level) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.levels[l]
}

// A server that keeps failing the same way is reported once at warn, not
// on every restart: its repeats are debug lines.
func TestAServerFailingTheSameWayIsWarnedOnce(t *testing.T) {
	srv := newTestServer(t, "crash")
	lines := &lineCounter{msg: "mcp server is down; starting it again", levels: map[slog.Level]int{}}
	o := fast()
	o.Logger = slog.New(lines)
	o.RestartMin, o.RestartMax = 10*time.Millisecond, 20*time.Millisecond
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"c": srv.ServerConfig}}, o)
	run(t, p)
	srv.WaitStarts(t, 6)
	jstest.Eventually(t, jstest.Wait, "four repeated failures logged", func() bool { return lines.count(slog.LevelDebug) >= 4 })
	if w := lines.count(slog.LevelWarn); w != 1 {
		t.Fatalf("%d warn lines for %d failures, want 1 (repeats at debug)", w, lines.count(slog.LevelDebug)+w)
	}
}
