package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// CallIDMeta is the _meta key of a tools/call request that carries the
// call's id, for a server that deduplicates. When the call is traced, the
// request's _meta also carries its W3C trace context under the keys
// "traceparent" and "tracestate" (package tracing).
const CallIDMeta = "dev.tollgate/call_id"

// codeRejected is the JSON-RPC code the SDK gives a request its own
// transport refused to send (jsonrpc2.ErrRejected), for which no server
// answered.
const codeRejected = -32005

// tool is one tool of an MCP server.
type tool struct {
	srv    *server
	name   string // Tollgate's name: "<server>.<sanitized remote name>"
	remote string // the server's name for it
	spec   tools.Spec
}

var _ tools.Describer = (*tool)(nil)

func newTool(s *server, name string, t *mcp.Tool) *tool {
	spec := tools.Spec{Name: name, Description: t.Description, Source: "mcp:" + s.name}
	if t.InputSchema != nil {
		if b, err := json.Marshal(t.InputSchema); err == nil {
			spec.InputSchema = b
		}
	}
	if a := t.Annotations; a != nil {
		readOnly := a.ReadOnlyHint
		spec.Hints = tools.Hints{ReadOnly: &readOnly, Destructive: a.DestructiveHint}
	}
	return &tool{srv: s, name: name, remote: t.Name, spec: spec}
}

// Name implements tools.Tool.
func (t *tool) Name() string { return t.name }

// Spec implements tools.Describer.
func (t *tool) Spec() tools.Spec { return t.spec }

// Run implements tools.Tool: a tools/call on the server's current session.
// See the package doc for what each failure becomes.
func (t *tool) Run(ctx context.Context, c tools.Call) (string, error) {
	args := json.RawMessage(c.Args)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if !json.Valid(args) {
		return "", fmt.Errorf("%s: arguments are not JSON", t.name)
	}
	sess := t.srv.session(ctx)
	if sess == nil {
		return "", errUnavailable("mcp server %s is not connected", t.srv.name)
	}
	meta := mcp.Meta{CallIDMeta: c.CallID}
	for k, v := range tracing.Context(ctx) { // the call's span, for a server that continues the trace
		meta[k] = v
	}
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Meta: meta, Name: t.remote, Arguments: args})
	if err != nil {
		return "", t.callError(ctx, err)
	}
	out := text(res)
	if res.IsError {
		return "", fmt.Errorf("%s: %s", t.name, out)
	}
	return out, nil
}

// callError says what a failed tools/call means for the call: see the
// package doc.
func (t *tool) callError(ctx context.Context, err error) error {
	var (
		opErr *net.OpError
		wire  *jsonrpc.Error
	)
	switch {
	case errors.Is(err, mcp.ErrConnectionClosed), errors.Is(err, mcp.ErrSessionMissing),
		errors.As(err, &opErr) && opErr.Op == "dial":
		return errUnavailable("mcp server %s: call not sent: %v", t.srv.name, err)
	case errors.Is(err, errInvalidReply):
		return errUncertain(schemas.CodeToolReplyInvalid, "mcp server %s: %v", t.srv.name, err)
	case ctx.Err() != nil:
		return errUncertain(schemas.CodeExecutionUncertain, "mcp server %s: no reply in time: %v", t.srv.name, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errUncertain(schemas.CodeExecutionUncertain, "mcp server %s: connection lost during the call: %v", t.srv.name, err)
	case errors.As(err, &wire) && wire.Code != codeRejected:
		return fmt.Errorf("%s: mcp server %s answered with an error: %w", t.name, t.srv.name, err)
	default:
		return errUncertain(schemas.CodeExecutionUncertain, "mcp server %s: %v", t.srv.name, err)
	}
}

// text is the text of a tool result: its text content joined by newlines,
// other content described; the structured content when there is no
// content.
func text(res *mcp.CallToolResult) string {
	parts := make([]string, 0, len(res.Content))
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link %s]", c.URI))
		case *mcp.EmbeddedResource:
			switch r := c.Resource; {
			case r == nil:
				parts = append(parts, "[resource]")
			case r.Text != "":
				parts = append(parts, fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text))
			default:
				parts = append(parts, fmt.Sprintf("[resource %s, %d bytes]", r.URI, len(r.Blob)))
			}
		default:
			parts = append(parts, fmt.Sprintf("[%T]", c))
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			return string(b)
		}
	}
	return strings.Join(parts, "\n")
}

// errUnavailable and errUncertain build a call's coded errors.
func errUnavailable(format string, a ...any) error {
	return &schemas.Error{Code: schemas.CodeToolUnavailable, Reason: fmt.Sprintf(format, a...), Err: tools.ErrUnavailable}
}

func errUncertain(code schemas.Code, format string, a ...any) error {
	return &schemas.Error{Code: code, Reason: fmt.Sprintf(format, a...), Err: tools.ErrUncertain}
}
