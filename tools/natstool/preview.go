package natstool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/tools"
)

// PreviewRequest is the body of a preview request: JSON on the tool's
// preview subject. It carries no turn context: a preview acts for nobody.
type PreviewRequest struct {
	Tool   string          `json:"tool"`
	CallID string          `json:"call_id"`
	Args   json.RawMessage `json:"args"`
}

// PreviewReply is the body of a preview endpoint's reply: what the call
// would change. Kind is "diff" (Text a unified diff), "new_file" (Text
// the content the call would create), "unchanged" or "text" (Text in the
// tool's own words).
type PreviewReply = tools.Preview

// PreviewTool is a Tool whose service offers a preview endpoint
// (metadata "tollgate.preview"): a tools.Previewer.
type PreviewTool struct{ *Tool }

// PreviewSubject is the subject preview requests are sent to.
func (t *PreviewTool) PreviewSubject() string { return t.preview }

// Preview implements tools.Previewer: one request to the preview subject,
// the first reply taken, within ctx's deadline (tools.PreviewCall gives
// one). A service error, a reply that is not a PreviewReply of a known
// kind, or no responder is an error (a failed preview); ctx's end is
// context.DeadlineExceeded (a timed-out one).
func (t *PreviewTool) Preview(ctx context.Context, c tools.Call) (tools.Preview, error) {
	body, err := json.Marshal(PreviewRequest{Tool: t.spec.Name, CallID: c.CallID, Args: json.RawMessage(c.Args)})
	if err != nil {
		return tools.Preview{}, fmt.Errorf("encode preview request: %w", err)
	}
	m, err := t.p.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: t.preview, Data: body, Header: nats.Header{HeaderCallID: []string{c.CallID}}})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return tools.Preview{}, fmt.Errorf("no service answers on %s", t.preview)
	case ctx.Err() != nil:
		return tools.Preview{}, context.DeadlineExceeded
	case err != nil:
		return tools.Preview{}, fmt.Errorf("preview request on %s: %w", t.preview, err)
	}
	if code, desc := m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader); code != "" || desc != "" {
		return tools.Preview{}, fmt.Errorf("service error %s: %s", code, strings.ToValidUTF8(desc, "\uFFFD"))
	}
	if len(m.Data) > t.p.o.MaxReplyBytes {
		return tools.Preview{}, fmt.Errorf("preview reply of %d bytes is over the limit of %d", len(m.Data), t.p.o.MaxReplyBytes)
	}
	var r PreviewReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return tools.Preview{}, fmt.Errorf("preview reply is not JSON {kind, text}: %v", err)
	}
	if err := r.CheckKind(); err != nil {
		return tools.Preview{}, fmt.Errorf("preview reply: %w", err)
	}
	r.Text = strings.ToValidUTF8(r.Text, "\uFFFD")
	return r, nil
}
