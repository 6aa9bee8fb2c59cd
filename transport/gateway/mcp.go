package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The MCP gateway: /mcp serves the Model Context Protocol over streamable
// HTTP (github.com/modelcontextprotocol/go-sdk). Every HTTP request needs
// an API key with scope submit; a session is bound to the key that opened
// it (a request of another key on it is refused 403).
//
//   - tools/list: the executor's tool list (topology.SubjectToolsList),
//     without the tools whose policy mode for MCPAudience is deny and
//     without the gate tools of Claude Code's hooks (claude.*, hooks.go:
//     they only gate a tool Claude Code runs itself, so MCP neither lists
//     them nor calls them: a tools/call of one is TOOL_NOT_FOUND, with no
//     turn), with their input schemas and hints.
//   - tools/call: one call is one turn of the key's transport, sent by the
//     key (sender id = key id, principal <transport>:<key id>, verified as
//     the key vouches) in the DM channel "mcp-<key id>" (audience
//     personal), in session MCPSession. It returns once the call has a
//     result: at once when policy allows it, after a person decided when
//     it needs approval (with progress notifications every
//     mcpProgressEvery while it waits, if the client sent a progress
//     token). A result other than ok is isError, its text starting with
//     the reason code. MCP tasks are not offered: go-sdk v1.8.0 does not
//     implement them, so a gated call holds its request.
//
// Retries (oneCalls). MCP gives a call no identity of its own (a
// JSON-RPC id is per connection), so a call is known by what it asks: the
// message id of a call is deterministic (callMessageID): "mcp-" + the
// first 32 hex digits of H(H("mcp", transport, key id, session, tool, args
// digest), n), where transport and key id are the key's, the digest is that of the
// canonical arguments (docs/protocol.md §2.4) and n is an occurrence
// number. A call takes the lowest n whose turn an identical call made now
// picks up (pickUp):
//
//   - a turn that does not exist yet: the call submits it;
//   - a turn that has not ended (running, or waiting for a decision): the
//     call waits on it, so no second approval is asked;
//   - a turn that ended less than pickupWindow ago and whose call was
//     decided (by a person or a standing grant) and then ran, was denied,
//     or needs attention (its run's outcome is unknown): the call returns
//     its result at once and the tool does not run again.
//
// A turn that ended otherwise (its call needed no decision; its approval
// expired or was abandoned; it failed closed without running; it ended
// pickupWindow ago) is
// passed over for good, and the call is a new turn. Everything judged is
// the turn's batch record in KV, so the rule holds across connections,
// gateway restarts and replicas: a client that gave up waiting (a
// timeout, a dropped connection, a crash) and calls again gets the one
// result of the one run. The price is that a deliberate repeat of a
// decided call within pickupWindow of its end also gets that result
// instead of a new approval: one approval, one run. The occurrences passed
// over are remembered per process only to start the next scan there.

// MCPAudience is the audience of every MCP turn (channel kind dm).
const MCPAudience = schemas.AudiencePersonal

// mcpSessionHeader names an MCP client's own session within its key: a
// client that sends it gets session "mcp:<key id>:<value>".
const mcpSessionHeader = "Tollgate-Session"

const (
	// mcpProgressEvery is the interval of progress notifications while a
	// call waits for its result.
	mcpProgressEvery = 2 * time.Second
	// pickupWindow is how long an identical call picks up the result of
	// an ended, decided turn (see Retries above).
	pickupWindow = 15 * time.Minute
	// mcpListTimeout bounds the request for the tool list.
	mcpListTimeout = 5 * time.Second
)

// mcpGateway serves /mcp for one Server.
type mcpGateway struct {
	s       *Server
	calls   *oneCalls
	handler http.Handler
	cancels mcpCancels

	mu sync.Mutex
	// stopping is cancelled when the http.Server serving /mcp shuts down,
	// so that calls held open end and the shutdown is not held up.
	stopping   context.Context
	stop       context.CancelFunc
	registered map[*http.Server]bool
}

// mcpKeyCtx carries the authenticated *Key from the HTTP layer to the
// token verifier.
type mcpKeyCtx struct{}

func init() { routeHooks = append(routeHooks, mcpRoute) }

// mcpRoute registers /mcp on a new Server's mux.
func mcpRoute(s *Server, mux *http.ServeMux) {
	g := &mcpGateway{s: s, calls: newOneCalls(s), registered: map[*http.Server]bool{}, cancels: mcpCancels{inFlight: map[string]bool{}}}
	g.stopping, g.stop = context.WithCancel(context.Background())
	srv := mcp.NewServer(&mcp.Implementation{Name: "tollgate", Version: "1"}, &mcp.ServerOptions{
		Logger:       s.cfg.Logger,
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions: "Tools gated by Tollgate's policy: a call that needs approval returns once a person has decided.",
	})
	srv.AddReceivingMiddleware(g.middleware)
	stream := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Logger: s.cfg.Logger, MaxRequestBodyBytes: s.cfg.MaxBodyBytes,
		// The SDK refuses a loopback request whose Host is not localhost
		// (DNS rebinding of an MCP server without authentication). Every
		// request here carries an API key, which a page that rebinds a
		// name cannot send; and a TLS proxy in front of the gateway on
		// loopback forwards its own Host.
		DisableLocalhostProtection: true,
	})
	// The key, already checked by ServeHTTP, becomes the session's user:
	// the SDK refuses a request of another key on the session.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		k, _ := r.Context().Value(mcpKeyCtx{}).(*Key)
		if k == nil {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: k.ID, Expiration: k.NotAfter, Extra: map[string]any{"key": k}}, nil
	}
	g.handler = auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(stream)
	mux.Handle("/mcp", g)
}

// ServeHTTP authenticates the request (problem+json on failure) and hands
// it to the SDK.
func (g *mcpGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := g.s.Authenticate(w, r, ScopeSubmit)
	if key == nil {
		return
	}
	if hs, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok {
		g.watchShutdown(hs)
	}
	// A call waits for its decision and result, and GET holds a stream:
	// no deadline once the body is read.
	r = httpserve.HoldAfterBody(w, r, -1)
	if sid := r.Header.Get(mcpSessionIDHeader); r.Method == http.MethodPost && sid != "" {
		var done func()
		w, done = g.cancels.track(w, r, key.ID, sid, g.s.cfg.MaxBodyBytes, g.s.cfg.Logger)
		defer done()
	}
	g.handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mcpKeyCtx{}, key)))
}

// watchShutdown makes a shutdown of hs end the calls held open.
func (g *mcpGateway) watchShutdown(hs *http.Server) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.registered[hs] {
		return
	}
	g.registered[hs] = true
	hs.RegisterOnShutdown(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.stop()
		g.stopping, g.stop = context.WithCancel(context.Background())
		delete(g.registered, hs)
	})
}

// middleware answers tools/list and tools/call; every other method goes
// to the SDK.
func (g *mcpGateway) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			return g.listTools(ctx)
		case *mcp.CallToolRequest:
			key := requestKey(r.Extra)
			if key == nil {
				return nil, errors.New("tollgate: no API key on this request")
			}
			return g.call(ctx, key, r)
		}
		return next(ctx, method, req)
	}
}

// requestKey is the key ServeHTTP authenticated for the HTTP request that
// carried an MCP request.
func requestKey(extra *mcp.RequestExtra) *Key {
	if extra == nil || extra.TokenInfo == nil {
		return nil
	}
	k, _ := extra.TokenInfo.Extra["key"].(*Key)
	return k
}

// listTools asks an executor for the tool list and keeps the tools not
// denied to MCPAudience.
func (g *mcpGateway) listTools(ctx context.Context) (*mcp.ListToolsResult, error) {
	l, err := g.s.toolList(ctx)
	if err != nil {
		return nil, err
	}
	// The cache fields go-sdk fills for a list it answers itself (this
	// list skips that step): ttlMs 0, since the list is read anew on every
	// request and a policy change shows at the next one; cacheScope
	// private, since it is the answer to an API key and no cache should
	// serve it to a client without one.
	res := &mcp.ListToolsResult{Tools: []*mcp.Tool{}, Cacheable: mcp.Cacheable{TTLMs: 0, CacheScope: "private"}}
	for _, t := range l.Tools {
		if t.Modes[MCPAudience] == "deny" || claudeGate(t.Name) {
			continue // denied, or a gate of Claude Code's hooks (hooks.go)
		}
		var schema any = map[string]any{"type": "object"}
		if len(t.InputSchema) > 0 {
			schema = t.InputSchema
		}
		mt := &mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: schema}
		if t.Hints.ReadOnly != nil || t.Hints.Destructive != nil {
			mt.Annotations = &mcp.ToolAnnotations{DestructiveHint: t.Hints.Destructive, ReadOnlyHint: t.Hints.ReadOnly != nil && *t.Hints.ReadOnly}
		}
		res.Tools = append(res.Tools, mt)
	}
	return res, nil
}

// toolList asks an executor for the tool list (topology.SubjectToolsList),
// waiting at most mcpListTimeout.
func (s *Server) toolList(ctx context.Context) (*schemas.ToolList, error) {
	ctx, cancel := context.WithTimeout(ctx, mcpListTimeout)
	defer cancel()
	msg, err := s.cfg.JS.Conn().RequestWithContext(ctx, topology.SubjectToolsList, nil)
	if err != nil {
		return nil, fmt.Errorf("tollgate: the tool list is unavailable (no executor answered %s): %w", topology.SubjectToolsList, err)
	}
	var l schemas.ToolList
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		return nil, fmt.Errorf("tollgate: undecodable tool list: %w", err)
	}
	return &l, nil
}

// MCPSession is the session of an MCP call by key: "mcp:<key id>", or
// "mcp:<key id>:<Tollgate-Session header>" when the client sends one.
func MCPSession(key *Key, h http.Header) string {
	if v := h.Get(mcpSessionHeader); v != "" {
		return mcpSessionPrefix + key.ID + ":" + v
	}
	return mcpSessionPrefix + key.ID
}

// call runs one tools/call as a turn and returns its result.
func (g *mcpGateway) call(ctx context.Context, key *Key, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	g.mu.Lock()
	stopping := g.stopping
	g.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stopping.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if claudeGate(req.Params.Name) {
		return failedCall(schemas.CodeToolNotFound, "no tool named "+strconv.Quote(req.Params.Name)+" over MCP: the claude.* tools are the gates of Claude Code's hooks (POST /v1/hooks/pretooluse)"), nil
	}
	c := oneCall{
		kind: "mcp", session: MCPSession(key, req.Extra.Header), channel: "mcp-" + key.ID,
		tool: req.Params.Name, args: string(req.Params.Arguments),
	}
	var waiting func(string)
	if token := req.Params.GetProgressToken(); token != nil {
		waiting = func(turnID string) { go g.progress(ctx, req.Session, token, turnID) }
	}
	turnID, r, err := g.calls.run(ctx, key, c, waiting)
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return failedCall(ae.Code, ae.Detail), nil
	case err != nil:
		return nil, err
	}
	return callResult(turnID, schemas.CallID(turnID, 0), r), nil
}

// oneCall is a turn of one call sent for a client that waits for its
// result (an MCP tools/call, a hook): kind names the client ("mcp",
// "hook") in the message id. useID, when not empty, is the client's own id
// of the call (a hook's tool_use_id): the call is that id's one turn,
// whatever happened to it; without one, an identical call is matched by
// occurrence (see Retries above).
type oneCall struct {
	kind, session, channel, tool, args, useID string
}

// oneCalls runs oneCall turns, mapping a retried call to its earlier turn
// (see Retries above).
type oneCalls struct {
	s  *Server
	mu sync.Mutex
	// next: call base (callBase) -> the lowest occurrence not known to be
	// passed over for good, so that a scan starts there.
	next map[string]int
}

func newOneCalls(s *Server) *oneCalls {
	return &oneCalls{s: s, next: map[string]int{}}
}

// run submits c as key (sender id = key id, channel c.channel of kind dm)
// under its deterministic message id, calls waiting (if not nil) with the
// turn id once it is submitted, and waits for the call's result. A refusal
// before the call became a turn is an *apiError with its code; an end of
// ctx first is ctx's error (the turn goes on, and a later identical call
// picks it up).
func (o *oneCalls) run(ctx context.Context, key *Key, c oneCall, waiting func(turnID string)) (string, *schemas.ToolResult, error) {
	if err := schemas.CheckToolName(c.tool); err != nil {
		return "", nil, codedInput(err)
	}
	_, digest, err := schemas.CanonicalArgs(c.args)
	if err != nil {
		return "", nil, codedInput(err)
	}
	var msgID string
	if c.useID != "" {
		msgID = c.kind + "-" + hashParts(c.kind, key.Transport, key.ID, c.session, c.useID)[:32]
	} else {
		base := callBase(c.kind, key.Transport, key.ID, c.session, c.tool, digest)
		n, err := o.occurrence(ctx, key.Transport, c.kind, base)
		if err != nil {
			return "", nil, err
		}
		msgID = callMessageID(c.kind, base, n)
	}
	sub, err := o.s.submit(ctx, key, SubmitRequest{
		SessionID: c.session, MessageID: msgID,
		Sender:  SenderIn{ID: key.ID},
		Channel: ChannelIn{ID: c.channel, Kind: string(schemas.ChannelDM)},
		Calls:   []CallIn{{Tool: c.tool, Args: json.RawMessage(c.args)}},
	})
	if err != nil {
		return "", nil, err
	}
	if waiting != nil {
		waiting(sub.TurnID)
	}
	r, err := o.s.waitCall(ctx, schemas.CallID(sub.TurnID, 0))
	if err != nil {
		return "", nil, err
	}
	return sub.TurnID, r, nil
}

// callBase names an identical call: H(kind, transport, key id, session,
// tool, args digest), as ids are hashed in docs/protocol.md §3. The key id
// makes it the key's own: no other key's call has it, and POST /v1/turns
// derives no "mcp-" id (idempotentMessageID).
func callBase(kind, transport, keyID, session, tool, digest string) string {
	return hashParts(kind, transport, keyID, session, tool, digest)
}

// callMessageID is the message id of occurrence n of the identical call
// base: "<kind>-" + the first 32 hex digits of H(base, n).
func callMessageID(kind, base string, n int) string {
	return kind + "-" + hashParts(base, strconv.Itoa(n))[:32]
}

// hashParts is lower-case hex SHA-256 of each part followed by a NUL byte.
func hashParts(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// occurrence returns the lowest occurrence of the identical call base
// whose turn a call made now picks up, or that has no turn yet (see
// Retries above).
func (o *oneCalls) occurrence(ctx context.Context, transport, kind, base string) (int, error) {
	o.mu.Lock()
	n := o.next[base]
	o.mu.Unlock()
	now := o.s.cfg.Now()
	for ; ; n++ {
		turnID := schemas.TurnID(transport, callMessageID(kind, base, n))
		b, _, err := o.s.store.Batches.Get(ctx, turnID)
		if errors.Is(err, store.ErrNotFound) {
			return n, nil
		}
		if err != nil {
			return 0, unavailable(err)
		}
		if pickUp(b, now) {
			return n, nil
		}
		// Passed over for good: a turn that ended is never picked up
		// later if it is not now.
		o.mu.Lock()
		if o.next[base] <= n {
			o.next[base] = n + 1
		}
		o.mu.Unlock()
	}
}

// pickUp reports whether an identical call made at now takes the turn of
// b (see Retries above): while it has not ended, and for pickupWindow
// after it ended when its one call was decided.
func pickUp(b *schemas.BatchRecord, now time.Time) bool {
	if !b.State.Terminal() {
		return true
	}
	if now.Sub(b.UpdatedAt) > pickupWindow || len(b.Approvals) == 0 || b.Approvals[0] == "" || len(b.Results) == 0 || b.Results[0] == nil {
		return false
	}
	switch b.Results[0].Status {
	case schemas.ResultOK, schemas.ResultError, schemas.ResultDenied, schemas.ResultNeedsAttention:
		return true
	}
	return false // expired or abandoned (nobody decided), or failed closed (it did not run): a new call asks again
}

// progress sends a progress notification every mcpProgressEvery until ctx
// ends, naming the approval the call waits for once there is one.
func (g *mcpGateway) progress(ctx context.Context, ss *mcp.ServerSession, token any, turnID string) {
	t := time.NewTicker(mcpProgressEvery)
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		msg := "waiting for turn " + turnID
		if b, _, err := g.s.store.Batches.Get(ctx, turnID); err == nil && len(b.Approvals) > 0 && b.Approvals[0] != "" {
			msg = "waiting for a decision on approval " + b.Approvals[0]
		}
		if err := ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(i), Message: msg}); err != nil {
			return
		}
	}
}

// failedCall is the isError result of a call refused before it became a
// turn.
func failedCall(code schemas.Code, detail string) *mcp.CallToolResult {
	if code == "" {
		code = schemas.CodeInvalidInput
	}
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: string(code) + ": " + detail}},
		IsError: true,
		Meta:    mcp.Meta{"tollgate": map[string]any{"status": schemas.ResultFailed, "code": code}},
	}
}

// callResult is the MCP result of a call's ToolResult: the output when ok,
// else isError with "<code>: <reason>". _meta.tollgate names the turn,
// call, status, code and approval.
func callResult(turnID, callID string, r *schemas.ToolResult) *mcp.CallToolResult {
	text := r.Output
	if r.Status != schemas.ResultOK {
		code := r.Code
		if code == "" {
			code = schemas.Code(r.Status)
		}
		text = string(code) + ": " + r.Reason
		if r.Output != "" {
			text += "\n" + r.Output
		}
	}
	meta := map[string]any{"turn_id": turnID, "call_id": callID, "status": r.Status}
	if r.Code != "" {
		meta["code"] = r.Code
	}
	if r.ApprovalID != "" {
		meta["approval_id"] = r.ApprovalID
	}
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: text}},
		IsError: r.Status != schemas.ResultOK,
		Meta:    mcp.Meta{"tollgate": meta},
	}
}
