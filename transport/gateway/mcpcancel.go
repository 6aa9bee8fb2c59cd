package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
)

// Cancelled requests. MCP says the receiver of notifications/cancelled
// should not answer the request it names. go-sdk cancels the handler's
// context but still writes the handler's answer (for a held tools/call,
// {"code":0,"message":"context canceled"}) on the request's stream when
// the client keeps that stream open. The gateway keeps that answer off the
// wire: every POST of a session that carries requests has its SSE stream
// filtered, and an event that answers one of its requests after the same
// key cancelled that request on the same session is dropped; the stream
// then ends without it. A notifications/cancelled is recorded before
// go-sdk sees it, so the answer it provokes is always dropped. Only the
// key that opened the session can name its requests (go-sdk refuses
// another key's request on the session, but only after the gateway read
// it), so a cancellation is matched by key, session and request id, and
// only while that request's POST is in flight: nothing outlives it.

// mcpSessionIDHeader is the streamable HTTP transport's session header.
const mcpSessionIDHeader = "Mcp-Session-Id"

// mcpCancels are the requests in flight on /mcp, by mcpCancelKey, and
// whether their client cancelled them.
type mcpCancels struct {
	mu       sync.Mutex
	inFlight map[string]bool
}

func mcpCancelKey(keyID, session, id string) string {
	return keyID + "\x00" + session + "\x00" + id
}

// rpcID is a JSON-RPC id as a comparable string ("" for none): "n:<int>"
// or "s:<string>", so that 7 and "7" differ as they do in JSON-RPC.
func rpcID(raw json.RawMessage) string {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if len(raw) == 0 || d.Decode(&v) != nil {
		return ""
	}
	switch x := v.(type) {
	case string:
		return "s:" + x
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return "n:" + strconv.FormatInt(n, 10)
		}
		return "n:" + x.String()
	}
	return ""
}

// rpcMessage is what the gateway reads of a JSON-RPC message.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

// rpcMessages decodes a POST body: one message or a batch. A body that
// does not decode is no message (go-sdk answers it).
func rpcMessages(body []byte) []rpcMessage {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var ms []rpcMessage
		if json.Unmarshal(body, &ms) != nil {
			return nil
		}
		return ms
	}
	var m rpcMessage
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return []rpcMessage{m}
}

// track reads r's body (at most limit bytes, the rest is left to go-sdk),
// records the cancellations it carries and, when it carries requests,
// returns w wrapped to drop their answers once cancelled, and a func to
// call when the POST is done. r is a POST of session on keyID.
func (c *mcpCancels) track(w http.ResponseWriter, r *http.Request, keyID, session string, limit int64, log *slog.Logger) (http.ResponseWriter, func()) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil || int64(len(body)) > limit {
		return w, func() {} // go-sdk refuses it
	}
	var ids []string
	c.mu.Lock()
	for _, m := range rpcMessages(body) {
		switch id := rpcID(m.ID); {
		case m.Method == "notifications/cancelled" && id == "":
			k := mcpCancelKey(keyID, session, rpcID(m.Params.RequestID))
			if _, ok := c.inFlight[k]; ok {
				c.inFlight[k] = true
			}
		case m.Method != "" && id != "":
			k := mcpCancelKey(keyID, session, id)
			if _, ok := c.inFlight[k]; !ok {
				c.inFlight[k] = false
				ids = append(ids, id)
			}
		}
	}
	c.mu.Unlock()
	if len(ids) == 0 {
		return w, func() {}
	}
	f := &answerFilter{ResponseWriter: w, c: c, keyID: keyID, session: session, ids: ids, log: log}
	return f, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, id := range ids {
			delete(c.inFlight, mcpCancelKey(keyID, session, id))
		}
	}
}

// cancelled reports whether the request is in flight and was cancelled.
func (c *mcpCancels) cancelled(keyID, session, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight[mcpCancelKey(keyID, session, id)]
}

// answerFilter passes the SSE stream of one POST through, event by event,
// except the answers to its requests that were cancelled. A body that is
// not an event stream passes through untouched.
type answerFilter struct {
	http.ResponseWriter
	c              *mcpCancels
	keyID, session string
	ids            []string
	log            *slog.Logger

	checked, sse bool
	buf          []byte
}

func (f *answerFilter) Write(b []byte) (int, error) {
	if !f.checked {
		f.checked = true
		mt, _, _ := mime.ParseMediaType(f.Header().Get("Content-Type"))
		f.sse = mt == "text/event-stream"
	}
	if !f.sse {
		return f.ResponseWriter.Write(b)
	}
	f.buf = append(f.buf, b...)
	for {
		i := bytes.Index(f.buf, []byte("\n\n"))
		if i < 0 {
			return len(b), nil
		}
		ev := f.buf[:i+2]
		if !f.drop(ev) {
			if _, err := f.ResponseWriter.Write(ev); err != nil {
				f.buf = f.buf[i+2:]
				return len(b), err
			}
		}
		f.buf = f.buf[i+2:]
	}
}

// drop reports whether ev answers a request of this POST that was
// cancelled.
func (f *answerFilter) drop(ev []byte) bool {
	for line := range bytes.SplitSeq(ev, []byte("\n")) {
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		var m rpcMessage
		if json.Unmarshal(bytes.TrimSpace(data), &m) != nil || m.Method != "" {
			return false
		}
		id := rpcID(m.ID)
		for _, mine := range f.ids {
			if id == mine && f.c.cancelled(f.keyID, f.session, id) {
				f.log.Debug("mcp: answer to a cancelled request not sent", "session", f.session, "id", string(m.ID))
				return true
			}
		}
		return false
	}
	return false
}

// Flush flushes what passed the filter.
func (f *answerFilter) Flush() {
	_ = http.NewResponseController(f.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (f *answerFilter) Unwrap() http.ResponseWriter { return f.ResponseWriter }
