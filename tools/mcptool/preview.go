package mcptool

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/tools"
)

// PreviewMeta is the key, in a listed tool's _meta, that names its preview
// tool: another tool of the same server, annotated readOnlyHint true,
// which takes the same arguments and answers what a call with them would
// change, without changing anything. Its result's structured content
// {"kind": ..., "text": ...} (kinds as tools.Preview) is the preview;
// without one, its text content is a "text" preview. A result with isError
// is a failed preview.
const PreviewMeta = "dev.tollgate/preview"

// previewOf is the remote name of t's preview tool, "" when t names none,
// or why the one it names is refused (not listed, or not read-only).
func previewOf(t *mcp.Tool, byRemote map[string]*mcp.Tool) (companion, why string) {
	v, ok := t.Meta[PreviewMeta]
	if !ok {
		return "", ""
	}
	name, _ := v.(string)
	c := byRemote[name]
	switch {
	case name == "" || name == t.Name:
		return "", fmt.Sprintf("%s must name another tool of the server", PreviewMeta)
	case c == nil:
		return "", fmt.Sprintf("preview tool %q is not listed", name)
	case c.Annotations == nil || !c.Annotations.ReadOnlyHint:
		return "", fmt.Sprintf("preview tool %q is not annotated readOnlyHint: true", name)
	}
	return name, ""
}

// previewTool is a tool whose server names a preview tool for it: a
// tools.Previewer.
type previewTool struct {
	*tool
	companion string // the server's name of the preview tool
}

// Preview implements tools.Previewer: a tools/call of the preview tool
// with the call's arguments (and its id in _meta), within ctx's deadline.
func (t *previewTool) Preview(ctx context.Context, c tools.Call) (tools.Preview, error) {
	args := json.RawMessage(c.Args)
	if len(args) == 0 || !json.Valid(args) {
		return tools.Preview{}, fmt.Errorf("%s: arguments are not JSON", t.name)
	}
	sess := t.srv.session(ctx)
	if sess == nil {
		return tools.Preview{}, fmt.Errorf("mcp server %s is not connected", t.srv.name)
	}
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Meta: mcp.Meta{CallIDMeta: c.CallID}, Name: t.companion, Arguments: args})
	switch {
	case ctx.Err() != nil:
		return tools.Preview{}, context.DeadlineExceeded
	case err != nil:
		return tools.Preview{}, fmt.Errorf("preview tool %s: %v", t.companion, err)
	case res.IsError:
		return tools.Preview{}, fmt.Errorf("preview tool %s: %s", t.companion, text(res))
	}
	if res.StructuredContent != nil {
		var p tools.Preview
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &p); err != nil {
			return tools.Preview{}, fmt.Errorf("preview tool %s: structured content is not {kind, text}: %v", t.companion, err)
		}
		if err := p.CheckKind(); err != nil {
			return tools.Preview{}, fmt.Errorf("preview tool %s: %w", t.companion, err)
		}
		return p, nil
	}
	return tools.Preview{Kind: tools.PreviewText, Text: text(res)}, nil
}
