package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport is mcp.CommandTransport with its connection wrapped in a
// replyCheck, and kept so that it can be closed when Client.Connect fails.
type stdioTransport struct {
	cmd *mcp.CommandTransport

	mu   sync.Mutex
	conn mcp.Connection
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.cmd.Connect(ctx)
	if err != nil {
		return nil, err
	}
	rc := &replyCheck{Connection: c, calls: map[jsonrpc.ID]bool{}}
	t.mu.Lock()
	t.conn = rc
	t.mu.Unlock()
	return rc, nil
}

// close closes the connection, if there is one: it stops the process.
func (t *stdioTransport) close() {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// errInvalidReply marks what a stdio server sent that is not a valid reply:
// output that is not JSON-RPC (the connection cannot be read any further),
// or a tools/call result that is not a tool result. Either way the server
// may have acted on the call.
var errInvalidReply = errors.New("invalid reply")

// replyCheck is a stdio connection that tells an invalid reply apart from
// a lost one. The SDK fails a call the same way whether the server's output
// was garbage or the server went away; here a read error other than the end
// of the output, and a tools/call result that does not decode as a tool
// result, become errors wrapping errInvalidReply, which reach the caller of
// CallTool.
type replyCheck struct {
	mcp.Connection

	mu sync.Mutex
	// calls are the ids of the tools/call requests written and not
	// answered yet (one whose caller gave up stays until the connection
	// ends).
	calls map[jsonrpc.ID]bool
}

func (c *replyCheck) Write(ctx context.Context, msg jsonrpc.Message) error {
	if r, ok := msg.(*jsonrpc.Request); ok && r.IsCall() && r.Method == "tools/call" {
		c.mu.Lock()
		c.calls[r.ID] = true
		c.mu.Unlock()
	}
	return c.Connection.Write(ctx, msg)
}

func (c *replyCheck) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %w", errInvalidReply, err)
		}
		return nil, err
	}
	r, ok := msg.(*jsonrpc.Response)
	if !ok {
		return msg, nil
	}
	c.mu.Lock()
	call := c.calls[r.ID]
	delete(c.calls, r.ID)
	c.mu.Unlock()
	if call && r.Error == nil {
		var res mcp.CallToolResult
		if err := json.Unmarshal(r.Result, &res); err != nil {
			r.Result, r.Error = nil, fmt.Errorf("%w: tools/call result: %w", errInvalidReply, err)
		}
	}
	return r, nil
}
