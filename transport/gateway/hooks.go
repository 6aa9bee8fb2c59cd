package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
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
// (Bash -> claude.bash), with tool_input as its arguments, in session
// "claude:<session_id>" (channel "claude-<key id>", kind dm), sent by the
// key like an MCP call. Its message id is "hook-" + the first 32 hex
// digits of H("hook", transport, key id, "claude:<session_id>",
// tool_use_id): Claude Code's own id of the tool use names the call. The
// same tool_use_id is the same call (one turn, one approval, its one
// decision, also after a gateway restart or on another replica; the same
// id with another tool or input is refused IDEMPOTENCY_KEY_REUSED); a
// different tool_use_id is a new call that needs its own decision (or a
// standing grant), however alike its tool and input. session_id,
// tool_name and tool_use_id are required: a hook without one is denied
// INVALID_INPUT and nothing is published. The gate tools are a NATS tool service the gateway serves
// (ClaudeGateService, one endpoint per name of ClaudeTools): running one
// does nothing but answer "allowed", so the policy mode of the gate tool
// decides, and a required call waits for its approval like any other. A
// call whose result is ok is "allow"; anything else is "deny" with the
// result's code. A tool not in ClaudeTools has no gate tool: the executor
// fails it TOOL_NOT_FOUND, a deny.

// ClaudeGateService is the name of the gate tools' NATS service; their
// tool names are "claude.<name>".
const ClaudeGateService = "claude"

// ClaudeTools are the Claude Code tools the gateway serves gate tools
// for, lower-cased.
var ClaudeTools = []string{
	"bash", "edit", "glob", "grep", "ls", "multiedit", "notebookedit", "notebookread",
	"read", "task", "todowrite", "webfetch", "websearch", "write",
}

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
	if err := serveClaudeGates(s); err != nil {
		s.cfg.Logger.Error("gateway: Claude Code gate tools not served; hooks will be denied TOOL_NOT_FOUND", "err", err)
	}
	calls := newOneCalls(s)
	mux.HandleFunc("POST /v1/hooks/pretooluse", func(w http.ResponseWriter, r *http.Request) {
		key := s.Authenticate(w, r, ScopeSubmit)
		if key == nil {
			return
		}
		writeJSON(w, http.StatusOK, HookOutput{HookSpecificOutput: preToolUse(w, r, key, calls, s.cfg.MaxBodyBytes)})
	})
}

// preToolUse decides one hook. Every failure is a deny with its code:
// Claude Code lets a tool run when a hook answers anything but 2xx.
func preToolUse(w http.ResponseWriter, r *http.Request, key *Key, calls *oneCalls, limit int64) HookDecision {
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
	c := oneCall{kind: "hook", session: "claude:" + in.SessionID, channel: "claude-" + key.ID, tool: ClaudeGateService + "." + strings.ToLower(in.ToolName), args: args, useID: in.ToolUseID}
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
// which only the hook endpoint uses: MCP neither lists nor calls them.
func claudeGate(name string) bool { return strings.HasPrefix(name, ClaudeGateService+".") }

// serveClaudeGates starts the gate tools' NATS service: one endpoint per
// ClaudeTools name on tollgate.tool.claude.<name>, in the default queue
// group, answering every call "allowed" (no side effect: retry safe).
func serveClaudeGates(s *Server) error {
	svc, err := micro.AddService(s.cfg.JS.Conn(), micro.Config{
		Name: ClaudeGateService, Version: "1.0.0",
		Description: "Tollgate gateway: gates for Claude Code's tools (Claude Code runs the tool)",
	})
	if err != nil {
		return err
	}
	g := svc.AddGroup(natstool.SubjectPrefix + ClaudeGateService)
	for _, name := range ClaudeTools {
		err := g.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
			_ = req.Respond([]byte("allowed"), micro.WithHeaders(micro.Headers{"Tollgate-Call-Id": []string{req.Headers().Get("Tollgate-Call-Id")}}))
		}), micro.WithEndpointMetadata(map[string]string{
			natstool.MetaDescription: "Gate for Claude Code's " + name + " tool: allows it once policy or a person has decided (Claude Code runs the tool).",
			natstool.MetaRetrySafe:   "true",
		}))
		if err != nil {
			_ = svc.Stop()
			return err
		}
	}
	return nil
}
