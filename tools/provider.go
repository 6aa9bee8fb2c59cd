package tools

import (
	"context"
	"errors"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Spec describes a tool: what `tollgate tools` shows, what a planner offers
// a model, and what a call's arguments are validated against before anyone
// is asked to approve it. It is a wire type (the tool list's entries), so
// it lives in schemas: see schemas.ToolSpec for its fields.
type Spec = schemas.ToolSpec

// Hints are a tool's claims about its effects (schemas.ToolHints).
type Hints = schemas.ToolHints

// Describer is implemented by a tool that describes itself. A tool that
// does not is described by SpecOf from its name and Retryable.
type Describer interface {
	Spec() Spec
}

// SpecOf returns t's Spec: t.Spec() when t is a Describer (with Name and
// RetrySafe taken from t itself), else a Spec with source "go".
func SpecOf(t Tool) Spec {
	var s Spec
	if d, ok := t.(Describer); ok {
		s = d.Spec()
	}
	s.Name = t.Name()
	s.RetrySafe = RetrySafe(t)
	if s.Source == "" {
		s.Source = "go"
	}
	return s
}

// Provider supplies tools that live outside this process and may come and
// go while Tollgate runs (NATS tool services, MCP servers). The pipeline
// asks it for its tools whenever it resolves a call's tool by name, so a
// tool that appears needs no restart and one that disappears is no longer
// found.
type Provider interface {
	// Name names the provider in logs, errors and `tollgate tools`
	// (e.g. "nats", "mcp:github").
	Name() string
	// Tools returns the provider's current tools. It must be cheap (served
	// from a cache the provider refreshes) and bounded in time: a dead
	// remote makes it return what it last knew, or an error, never block
	// past ctx.
	Tools(ctx context.Context) ([]Tool, error)
}

// Refresher is implemented by a Provider that can look for its tools again
// at once (a discovery on the bus). The catalog calls Refresh when a call
// names a tool that no one offers, then looks once more, so a tool that
// appeared since the provider's last look is found without waiting for its
// next one. Refresh bounds its own rate (a burst of calls of an unknown
// tool must not become a burst of discoveries) and its time (ctx).
type Refresher interface {
	Refresh(ctx context.Context) error
}

// Service is implemented by a Provider that needs a loop of its own (a
// supervisor of MCP server processes, a discovery refresher). The pipeline
// runs it beside the stages; it returns when ctx is cancelled, after
// stopping what it started.
type Service interface {
	Run(ctx context.Context) error
}

// ErrUncertain is wrapped by a tool's Run error when the tool may or may not
// have acted: the request went out and no reply came back in time, or the
// reply was lost. The pipeline reports such a call needs_attention with
// EXECUTION_UNCERTAIN (or, for a RetrySafe tool, runs it again under the
// same claim rules as a worker that died mid-call); it never reports it as
// an ordinary error result, which would tell the requester it did not run.
var ErrUncertain = errors.New("tool outcome uncertain")

// ErrUnavailable is wrapped by a tool's Run error when the tool certainly
// did not act: nothing was listening for the request (NATS "no
// responders"), or the server could not be reached before anything was
// sent. The call's result is failed with TOOL_UNAVAILABLE.
var ErrUnavailable = errors.New("tool unavailable")
