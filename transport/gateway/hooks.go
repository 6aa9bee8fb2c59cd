package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// Claude Code's PreToolUse hook: POST /v1/hooks/pretooluse takes the
// hook's input and answers the permission decision once policy, or a
// person, has decided.
//
// Claude Code runs the tool itself; Tollgate only gates it. A hook call is
// a turn of one call of the gate tool "claude.<tool_name lower-cased>"
// (Bash -> claude.bash, Agent -> claude.agent, mcp__github__create_issue
// -> claude.mcp__github__create_issue), with tool_input as its arguments,
// in session "claude:<key id>:<session_id>" (reserved to the key, see
// sessionOwner; channel "claude-<key id>", kind dm), sent by the key like
// an MCP call. Its message id is "hook-" + the first 32 hex digits of
// H("hook", transport, key id, session, tool_use_id): Claude Code's own id
// of the tool use names the call, within the key. The same tool_use_id is
// the same call (one turn, one approval, its one decision, also after a
// gateway restart or on another replica; the same id with another tool or
// input is refused IDEMPOTENCY_KEY_REUSED); a different tool_use_id is a
// new call that needs its own decision (or a standing grant), however
// alike its tool and input. session_id, tool_name and tool_use_id are
// required: a hook without one is denied INVALID_INPUT and nothing is
// published.
//
// Every tool name gets a gate, without a release per tool Claude Code
// adds or renames: the gate tools are a NATS tool service the gateway
// serves (ClaudeGateService), with one endpoint per name of ClaudeTools
// from the start and one added the first time a hook names any other tool
// (at most maxClaudeGates in all). A gate's input schema is a permissive
// object schema ({"type":"object"}: Claude Code checks its own tools'
// input), and its policy is the policy's rule for its name, else for
// "claude.*", else the default, as for any tool. Running a gate does
// nothing but answer "allowed", so the policy mode of the gate tool
// decides, and a required call waits for its approval like any other. A
// call whose result is ok is "allow"; anything else is "deny" with the
// result's code. A tool_name that cannot name a gate (not
// [A-Za-z0-9_-]{1,57}: "claude." and it make at most 64 characters) is
// denied TOOL_NAME_INVALID, and nothing is published: the hook fails
// closed.

// ClaudeGateService is the name of the gate tools' NATS service; their
// tool names are "claude.<name>" (schemas.GateToolPrefix).
const ClaudeGateService = "claude"

// ClaudeTools are the Claude Code tools the gateway serves gate tools for
// from the start, lower-cased: the tools of Claude Code 2.1 (its tools
// reference) and the names earlier versions used (task, multiedit, ls,
// notebookread), so that a hook of either finds its gate at once. Any
// other name gets its gate on first use.
var ClaudeTools = []string{
	"agent", "askuserquestion", "bash", "croncreate", "crondelete", "cronlist", "edit",
	"enterplanmode", "enterworktree", "exitplanmode", "exitworktree", "glob", "grep",
	"listmcpresourcestool", "ls", "lsp", "multiedit", "notebookedit", "notebookread",
	"powershell", "read", "readmcpresourcetool", "skill", "task", "taskcreate", "taskget",
	"tasklist", "taskoutput", "taskstop", "taskupdate", "todowrite", "toolsearch",
	"webfetch", "websearch", "write",
}

// CodeToolNameInvalid is the code of a hook denied because its tool_name
// cannot name a gate tool.
const CodeToolNameInvalid schemas.Code = "TOOL_NAME_INVALID"

// claudeToolName is what a hook's tool_name may be: "claude." and it
// lower-cased are a tool name (schemas.CheckToolName), one NATS subject
// token.
var claudeToolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,57}$`)

// maxClaudeGates bounds the gate tools one gateway serves (each is a
// subscription), so that hooks naming ever new tools cannot grow it
// without end; a name past it is denied TOOL_UNAVAILABLE.
const maxClaudeGates = 512

// gateListWait bounds how long a hook naming a tool for the first time
// waits for the executor to list its new gate (its next discovery) before
// it is submitted anyway; gateListEvery is how often it asks.
const (
	gateListWait  = 15 * time.Second
	gateListEvery = 200 * time.Millisecond
)

// CodeDecisionPending is the code of a hook answered deny because no
// decision came within its wait; the approval stays pending.
const CodeDecisionPending schemas.Code = "DECISION_PENDING"

const (
	// claudeHookTimeout is the shortest default timeout Claude Code gives
	// a hook that may call the endpoint: 600 s for command and http hooks
	// in its current hooks reference, 60 s in earlier versions. A hook
	// that times out does not block the tool, so the default wait must
	// end well inside it.
	claudeHookTimeout = 60 * time.Second
	// hookMargin is what the default wait leaves of claudeHookTimeout for
	// the answer to reach Claude Code (curl, a proxy, a loaded machine).
	hookMargin = 10 * time.Second
	// hookWait is how long a hook waits for the decision by default.
	hookWait = claudeHookTimeout - hookMargin
	// hookMaxWait caps ?wait=.
	hookMaxWait = time.Hour
)

// PreToolUse is the input of Claude Code's PreToolUse hook (the fields
// the gateway reads; others are ignored).
type PreToolUse struct {
	SessionID     string          `json:"session_id"`
	HookEventName string          `json:"hook_event_name"`
	ToolName      string          `json:"tool_name"`
	ToolInput     json.RawMessage `json:"tool_input"`
	ToolUseID     string          `json:"tool_use_id"`
}

// HookOutput is the hook's answer.
type HookOutput struct {
	HookSpecificOutput HookDecision `json:"hookSpecificOutput"`
}

// HookDecision is the permission decision of a PreToolUse hook.
type HookDecision struct {
	HookEventName            string `json:"hookEventName"`
	PermissionDecision       string `json:"permissionDecision"` // allow or deny
	PermissionDecisionReason string `json:"permissionDecisionReason"`
}

func init() { routeHooks = append(routeHooks, hookRoute) }

// hookRoute registers POST /v1/hooks/pretooluse and starts the gate
// tools' service on the gateway's connection (it lives as long as the
// connection).
func hookRoute(s *Server, mux *http.ServeMux) {
	gates, err := serveClaudeGates(s)
	if err != nil {
		s.cfg.Logger.Error("gateway: Claude Code gate tools not served; hooks will be denied TOOL_NOT_FOUND", "err", err)
	}
	calls := newOneCalls(s)
	mux.HandleFunc("POST /v1/hooks/pretooluse", func(w http.ResponseWriter, r *http.Request) {
		key := s.Authenticate(w, r, ScopeSubmit)
		if key == nil {
			return
		}
		writeJSON(w, http.StatusOK, HookOutput{HookSpecificOutput: preToolUse(w, r, key, calls, gates, s.cfg.MaxBodyBytes)})
	})
}

// preToolUse decides one hook. Every failure is a deny with its code:
// Claude Code lets a tool run when a hook answers anything but 2xx.
func preToolUse(w http.ResponseWriter, r *http.Request, key *Key, calls *oneCalls, gates *claudeGates, limit int64) HookDecision {
	deny := func(code schemas.Code, detail string) HookDecision {
		return HookDecision{HookEventName: "PreToolUse", PermissionDecision: "deny", PermissionDecisionReason: string(code) + ": " + detail}
	}
	var in PreToolUse
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, limit), &in, true); err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return deny(ae.Code, ae.Detail)
		}
		return deny(schemas.CodeMalformed, "the body is not a PreToolUse hook input: "+err.Error())
	}
	if in.HookEventName != "" && in.HookEventName != "PreToolUse" {
		return deny(schemas.CodeInvalidInput, "hook_event_name "+in.HookEventName+", want PreToolUse")
	}
	for _, f := range [...]struct{ name, v string }{{"session_id", in.SessionID}, {"tool_name", in.ToolName}, {"tool_use_id", in.ToolUseID}} {
		if f.v == "" {
			return deny(schemas.CodeInvalidInput, f.name+" is missing: a PreToolUse hook input names its session, tool and tool use")
		}
	}
	if !claudeToolName.MatchString(in.ToolName) {
		return deny(CodeToolNameInvalid, "tool_name "+strconv.Quote(clipName(in.ToolName))+" cannot name a gate tool: want [A-Za-z0-9_-]{1,57}")
	}
	gate := strings.ToLower(in.ToolName)
	wait := hookWait
	if q := r.URL.Query().Get("wait"); q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d <= 0 {
			return deny(schemas.CodeInvalidInput, "wait="+q+": want a positive duration")
		}
		wait = min(d, hookMaxWait)
	}
	httpserve.Hold(w, r, wait)
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	args := string(in.ToolInput)
	if args == "" || args == "null" {
		args = "{}"
	}
	if gates != nil {
		if err := gates.ensure(ctx, gate); err != nil {
			return deny(schemas.CodeToolUnavailable, err.Error())
		}
	}
	c := oneCall{kind: "hook", session: ClaudeSession(key, in.SessionID), channel: "claude-" + key.ID, tool: ClaudeGateService + "." + gate, args: args, useID: in.ToolUseID}
	turnID, res, err := calls.run(ctx, key, c, nil)
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return deny(ae.Code, ae.Detail)
	case errors.Is(err, context.DeadlineExceeded):
		return deny(CodeDecisionPending, "no decision within "+wait.String()+"; the approval stays pending for this tool use only (a new attempt is a new call)")
	case err != nil:
		return deny(CodeUnavailable, err.Error())
	case res.Status != schemas.ResultOK:
		return deny(res.Code, res.Reason+" (turn "+turnID+")")
	}
	return HookDecision{HookEventName: "PreToolUse", PermissionDecision: "allow", PermissionDecisionReason: "allowed by Tollgate (turn " + turnID + ")"}
}

// claudeGate reports whether name is one of the gate tools (claude.*),
// which only the hook endpoint uses: MCP neither lists nor calls them
// (schemas.IsGateTool, the planner's rule too).
func claudeGate(name string) bool { return schemas.IsGateTool(name) }

// ClaudeSession is the session of the hook calls key sends for Claude
// Code's session sessionID: "claude:<key id>:<session_id>", reserved to
// key (sessionOwner).
func ClaudeSession(key *Key, sessionID string) string {
	return claudeSessionPrefix + key.ID + ":" + sessionID
}

// clipName shortens a refused name for a reason.
func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// claudeGates are the gate tools' NATS service: the names it serves, and
// what serves another.
type claudeGates struct {
	s     *Server
	group micro.Group
	mu    sync.Mutex
	// served: gate name -> a channel closed once the executor lists it
	// (or gateListWait ran out).
	served map[string]chan struct{}
}

// serveClaudeGates starts the gate tools' NATS service with one endpoint
// per ClaudeTools name (see addGate).
func serveClaudeGates(s *Server) (*claudeGates, error) {
	svc, err := micro.AddService(s.cfg.JS.Conn(), micro.Config{
		Name: ClaudeGateService, Version: "1.0.0",
		Description: "Tollgate gateway: gates for Claude Code's tools (Claude Code runs the tool)",
	})
	if err != nil {
		return nil, err
	}
	g := &claudeGates{s: s, group: svc.AddGroup(natstool.SubjectPrefix + ClaudeGateService), served: map[string]chan struct{}{}}
	for _, name := range ClaudeTools {
		if err := g.addGate(name); err != nil {
			_ = svc.Stop()
			return nil, err
		}
		listed := make(chan struct{})
		close(listed)
		g.served[name] = listed
	}
	return g, nil
}

// addGate adds the endpoint of gate name on tollgate.tool.claude.<name>,
// in the default queue group, answering every call "allowed" (no side
// effect: retry safe), with a permissive object schema. Its metadata
// depend on name alone, so replicas that serve it offer it alike.
func (g *claudeGates) addGate(name string) error {
	return g.group.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
		_ = req.Respond([]byte("allowed"), micro.WithHeaders(micro.Headers{"Tollgate-Call-Id": []string{req.Headers().Get("Tollgate-Call-Id")}}))
	}), micro.WithEndpointMetadata(map[string]string{
		natstool.MetaDescription: "Gate for Claude Code's " + name + " tool: allows it once policy or a person has decided (Claude Code runs the tool).",
		natstool.MetaSchema:      `{"type":"object"}`,
		natstool.MetaRetrySafe:   "true",
	}))
}

// ensure makes sure gate name is served, adding it the first time, and
// waits (until ctx ends or at most gateListWait) for an executor to list
// "claude.<name>", so that the call finds its tool. A name past
// maxClaudeGates is an error; a gate an executor does not list in time is
// submitted anyway (an executor looks again for a tool it does not know,
// and fails the call TOOL_NOT_FOUND, a deny, if it still does not find
// it).
func (g *claudeGates) ensure(ctx context.Context, name string) error {
	g.mu.Lock()
	listed, ok := g.served[name]
	if !ok {
		if len(g.served) >= maxClaudeGates {
			g.mu.Unlock()
			return fmt.Errorf("this gateway already serves %d Claude Code gate tools, its most: claude.%s is not served", maxClaudeGates, name)
		}
		if err := g.addGate(name); err != nil {
			g.mu.Unlock()
			return fmt.Errorf("serving the gate tool claude.%s: %w", name, err)
		}
		listed = make(chan struct{})
		g.served[name] = listed
		g.s.cfg.Logger.Info("gateway: serving a gate for a new Claude Code tool", "tool", ClaudeGateService+"."+name)
		go g.awaitListed(name, listed)
	}
	g.mu.Unlock()
	select {
	case <-listed:
	case <-ctx.Done():
	}
	return nil
}

// awaitListed closes listed once an executor lists gate name, or after
// gateListWait.
func (g *claudeGates) awaitListed(name string, listed chan struct{}) {
	defer close(listed)
	ctx, cancel := context.WithTimeout(context.Background(), gateListWait)
	defer cancel()
	t := time.NewTicker(gateListEvery)
	defer t.Stop()
	for {
		if l, err := g.s.toolList(ctx); err == nil && slices.ContainsFunc(l.Tools, func(t schemas.ToolInfo) bool { return t.Name == ClaudeGateService+"."+name }) {
			return
		}
		select {
		case <-ctx.Done():
			g.s.cfg.Logger.Warn("gateway: no executor lists the new gate tool yet; its calls are submitted anyway", "tool", ClaudeGateService+"."+name, "waited", gateListWait)
			return
		case <-t.C:
		}
	}
}
