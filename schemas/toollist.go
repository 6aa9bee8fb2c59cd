package schemas

import (
	"encoding/json"
	"strings"
)

// The tool list: the JSON answer of an executor on the core NATS request
// subject tollgate.tools.list (docs/protocol.md §5.2), read by `tollgate
// tools`, the gateway's MCP tools/list and anyone writing a UI. Its types
// live here, with the other wire types, so that a reader of the list
// depends on the protocol packages only, not on the executor that answers.

// ToolList is the answer on tollgate.tools.list: every tool the executor
// can call now, as its catalog resolves each name, sorted by name, with the
// policy's mode for each audience.
type ToolList struct {
	PolicyVersion string     `json:"policy_version"`
	Tools         []ToolInfo `json:"tools"`
	// Errors names each provider that could not list its tools (its tools
	// are missing from Tools).
	Errors []string `json:"errors,omitempty"`
}

// ToolInfo is one tool: its spec, and how a call of it is treated for a
// turn of each audience (policy.Policy.ModeFor, hints included).
type ToolInfo struct {
	ToolSpec
	Modes map[Audience]ToolMode `json:"modes"`
}

// ToolMode is how the policy treats a call: "never" (runs without
// approval), "required" (waits for an approval) or "deny" (never runs).
// policy.Mode is this type, with its constants.
type ToolMode string

// ToolAudiences are the audiences ToolInfo.Modes covers, narrowest first.
var ToolAudiences = []Audience{AudiencePersonal, AudienceTeam, AudiencePublic}

// ToolSpec describes a tool: what `tollgate tools` shows, what a planner offers
// a model, and what a call's arguments are validated against before anyone
// is asked to approve it.
type ToolSpec struct {
	// Name is the tool's name in calls and in the policy
	// (schemas.CheckToolName: [a-z0-9_.-]{1,64}). Tools from a provider are
	// named "<prefix>.<tool>", so a policy can name them by pattern
	// ("github.*").
	Name string `json:"name"`
	// Description is the tool's own one-paragraph description.
	Description string `json:"description,omitempty"`
	// Source says where the tool comes from: "builtin", "go" (a Go tool
	// passed in by the embedding program), "nats:<service>" (a NATS tool
	// service) or "mcp:<server>" (a tool of an MCP server).
	Source string `json:"source"`
	// InputSchema is the JSON Schema of the arguments object; empty means
	// any JSON object.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// RetrySafe: running the call again has the same effect as running it
	// once (see Retryable).
	RetrySafe bool `json:"retry_safe"`
	// Hints are the tool's own claims about its effects (MCP annotations).
	// They may make the policy's default stricter, never looser, and never
	// change a rule the policy states for the tool.
	Hints ToolHints `json:"hints,omitzero"`
}

// ToolHints are a tool's claims about its effects. Nil means not stated.
type ToolHints struct {
	ReadOnly    *bool `json:"read_only,omitempty"`
	Destructive *bool `json:"destructive,omitempty"`
}

// GateToolPrefix starts the name of every gate tool of Claude Code's
// PreToolUse hooks ("claude.<tool>", served by transport/gateway). A gate
// only gates a tool Claude Code runs itself, so no model is offered one:
// neither MCP's tools/list nor the planner lists them, and a call of one
// from either is TOOL_NOT_FOUND.
const GateToolPrefix = "claude."

// IsGateTool reports whether name is a gate tool (GateToolPrefix).
func IsGateTool(name string) bool { return strings.HasPrefix(name, GateToolPrefix) }
