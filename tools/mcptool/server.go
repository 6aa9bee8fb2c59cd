package mcptool

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// maxTools bounds the tools taken from one server's list.
const maxTools = 1000

// server is one configured MCP server: its connection, while there is
// one, and its tools as last listed.
type server struct {
	name string
	cfg  ServerConfig
	o    Options
	log  *slog.Logger
	// changed is signalled (without blocking) when the server notifies
	// that its tools changed; the session's loop lists them again.
	changed chan struct{}

	mu   sync.RWMutex
	sess *mcp.ClientSession // nil while not connected
	// connecting is closed when the connect attempt under way ends; nil
	// while none is (the server is up, or waiting to be started again).
	// Run's first attempt counts as under way from New on.
	connecting chan struct{}
	tools      []tools.Tool

	// downMu guards the last failure logged: a server that keeps failing
	// the same way is logged once at warn, its repeats at debug, and its
	// recovery at info with how many failures it ended.
	downMu      sync.Mutex
	downErr     string
	downRepeats int
}

func newServer(name string, cfg ServerConfig, o Options) *server {
	return &server{
		name: name, cfg: cfg, o: o, changed: make(chan struct{}, 1), connecting: make(chan struct{}),
		log: o.Logger.With("mcp_server", name),
	}
}

// session returns the live session, or nil. While a connect attempt is
// under way it waits for the attempt's end, within ctx.
func (s *server) session(ctx context.Context) *mcp.ClientSession {
	s.mu.RLock()
	sess, connecting := s.sess, s.connecting
	s.mu.RUnlock()
	if sess != nil || connecting == nil {
		return sess
	}
	select {
	case <-connecting:
	case <-ctx.Done():
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sess
}

// beginConnect marks a connect attempt as under way.
func (s *server) beginConnect() {
	s.mu.Lock()
	if s.connecting == nil {
		s.connecting = make(chan struct{})
	}
	s.mu.Unlock()
}

// setSession makes sess (nil: none) the session and ends the connect
// attempt under way, if any.
func (s *server) setSession(sess *mcp.ClientSession) {
	s.mu.Lock()
	s.sess = sess
	if s.connecting != nil {
		close(s.connecting)
		s.connecting = nil
	}
	s.mu.Unlock()
}

// currentTools returns the tools as last listed.
func (s *server) currentTools() []tools.Tool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tools
}

// listOnce connects, lists the tools and disconnects (the start-up
// listing).
func (s *server) listOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.o.ConnectTimeout)
	defer cancel()
	sess, err := s.connect(ctx)
	if err == nil {
		err = s.list(ctx, sess)
		_ = sess.Close()
	}
	if err != nil {
		s.logDown("mcp server could not be listed at start; its tools appear once it is up", err)
	}
}

// logDown logs a failure of the server: at warn when it is not the one
// logged last (a newcomer sees the cause once, not on every retry), at
// debug when it repeats it.
func (s *server) logDown(msg string, err error, args ...any) {
	text := fmt.Sprint(err)
	s.downMu.Lock()
	repeat := text == s.downErr
	if repeat {
		s.downRepeats++
	} else {
		s.downErr, s.downRepeats = text, 0
	}
	n := s.downRepeats
	s.downMu.Unlock()
	args = append([]any{"err", err}, args...)
	if repeat {
		s.log.Debug(msg, append(args, "repeats", n)...)
		return
	}
	s.log.Warn(msg, args...)
}

// logUp logs a connection, with the number of failures it ended.
func (s *server) logUp() {
	s.downMu.Lock()
	failed := s.downErr != ""
	n := s.downRepeats + 1
	s.downErr, s.downRepeats = "", 0
	s.downMu.Unlock()
	if failed {
		s.log.Info("mcp server connected", "after_failures", n)
		return
	}
	s.log.Info("mcp server connected")
}

// supervise keeps the server connected until ctx is cancelled: after a
// session ends or a start fails, it waits (with back-off, see Options) and
// starts again.
func (s *server) supervise(ctx context.Context) {
	wait := s.o.RestartMin
	for {
		began := time.Now()
		err := s.serve(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > s.o.RestartMax {
			wait = s.o.RestartMin
		}
		s.logDown("mcp server is down; starting it again", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, s.o.RestartMax)
	}
}

// serve runs one session: it connects, lists the tools, offers the session
// to calls and lists the tools again on a change notification and on the
// refresh interval, until the session ends, a listing fails or ctx is
// cancelled. It closes the session (stopping a stdio server) before it
// returns.
func (s *server) serve(ctx context.Context) error {
	s.beginConnect()
	cctx, cancel := context.WithTimeout(ctx, s.o.ConnectTimeout)
	defer cancel()
	sess, err := s.connect(cctx)
	if err != nil {
		s.setSession(nil)
		return err
	}
	defer func() {
		s.setSession(nil)
		_ = sess.Close()
	}()
	if err := s.list(cctx, sess); err != nil {
		return err
	}
	s.setSession(sess)
	s.logUp()

	ended := make(chan error, 1)
	go func() { ended <- sess.Wait() }()
	tick := time.NewTicker(s.o.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-ended:
			return fmt.Errorf("connection ended: %v", err)
		case <-s.changed:
		case <-tick.C:
		}
		if err := s.list(ctx, sess); err != nil {
			return err
		}
	}
}

// connect starts (stdio) or reaches (HTTP) the server and initializes an
// MCP session with it.
func (s *server) connect(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "tollgate", Version: "1"}, &mcp.ClientOptions{
		Logger: s.log,
		// No roots, no sampling, no elicitation: a server gets nothing
		// from Tollgate but calls.
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case s.changed <- struct{}{}:
			default:
			}
		},
	})
	if s.cfg.URL != "" {
		hc := &http.Client{
			Transport: &headerTransport{base: http.DefaultTransport, headers: s.cfg.Headers},
			// A redirect would take the configured headers (credentials)
			// to wherever it points: none is followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc}, nil)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", s.cfg.URL, err)
		}
		return sess, nil
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = s.env()
	cmd.Stderr = &stderrLog{log: s.log}
	cmd.WaitDelay = s.o.StopGrace
	t := &stdioTransport{cmd: &mcp.CommandTransport{Command: cmd, TerminateDuration: s.o.StopGrace}}
	sess, err := client.Connect(ctx, t, nil)
	if err != nil {
		t.close() // Connect does not always close what it started
		return nil, fmt.Errorf("start %s: %w", s.cfg.Command, err)
	}
	return sess, nil
}

// env is a stdio server's environment: the few inherited variables, then
// the configured ones (which win).
func (s *server) env() []string {
	var env []string
	for _, k := range inheritedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for _, k := range sortedKeys(s.cfg.Env) {
		env = append(env, k+"="+s.cfg.Env[k])
	}
	return env
}

// list lists the server's tools on sess and makes them the current ones.
func (s *server) list(ctx context.Context, sess *mcp.ClientSession) error {
	ctx, cancel := context.WithTimeout(ctx, s.o.ConnectTimeout)
	defer cancel()
	var listed []*mcp.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list tools: %w", err)
		}
		if len(listed) == maxTools {
			s.log.Warn("mcp server lists too many tools; the rest are ignored", "max", maxTools)
			break
		}
		listed = append(listed, t)
	}
	ts, refused := s.build(listed)
	s.mu.Lock()
	same := slices.EqualFunc(s.tools, ts, func(a, b tools.Tool) bool { return a.Name() == b.Name() })
	s.tools = ts
	s.mu.Unlock()
	if !same {
		for _, r := range refused {
			s.log.Warn("mcp tool refused", "reason", r)
		}
		s.log.Info("mcp tools listed", "tools", len(ts))
	}
	return nil
}

// build turns a tools/list into Tollgate tools, sorted by name, and says
// which were refused and why.
func (s *server) build(listed []*mcp.Tool) (ts []tools.Tool, refused []string) {
	byName := map[string][]*mcp.Tool{}
	byRemote := map[string]*mcp.Tool{}
	for _, t := range listed {
		byRemote[t.Name] = t
	}
	for _, t := range listed {
		n := s.name + "." + sanitize(t.Name)
		byName[n] = append(byName[n], t)
	}
	for _, n := range sortedKeys(byName) {
		same := byName[n]
		if len(same) > 1 {
			var names []string
			for _, t := range same {
				names = append(names, fmt.Sprintf("%q", t.Name))
			}
			refused = append(refused, fmt.Sprintf("tools %s would all be named %s", strings.Join(names, ", "), n))
			continue
		}
		if err := schemas.CheckToolName(n); err != nil {
			refused = append(refused, fmt.Sprintf("tool %q: %v", same[0].Name, err))
			continue
		}
		t := newTool(s, n, same[0])
		companion, why := previewOf(same[0], byRemote)
		switch {
		case why != "":
			refused = append(refused, fmt.Sprintf("the preview of tool %q: %s", same[0].Name, why))
		case companion != "":
			ts = append(ts, &previewTool{tool: t, companion: companion})
			continue
		}
		ts = append(ts, t)
	}
	return ts, refused
}

// sanitize makes an MCP tool name fit the tool-name rule: lowercased, any
// other character than a-z 0-9 _ . - replaced by "_".
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, name)
}

// headerTransport adds the configured headers to every request.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range t.headers {
			r.Header.Set(k, v)
		}
	}
	return t.base.RoundTrip(r)
}

// maxStderrLine cuts what is logged of one line of a server's stderr.
const maxStderrLine = 1 << 10

// stderrLog logs a stdio server's stderr line by line. exec writes to it
// from one goroutine.
type stderrLog struct {
	log  *slog.Logger
	line []byte
}

func (w *stderrLog) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.line = append(w.line, p[:min(len(p), maxStderrLine-len(w.line))]...)
			break
		}
		w.line = append(w.line, p[:min(i, maxStderrLine-len(w.line))]...)
		w.log.Info("mcp server stderr", "line", string(w.line))
		w.line, p = w.line[:0], p[i+1:]
	}
	return n, nil
}
