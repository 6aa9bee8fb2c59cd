package natstool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// HeaderCallID carries the call id on a request, and must carry it back,
// unchanged, on the reply.
const HeaderCallID = "Tollgate-Call-Id"

// Request is the body of a call: JSON on the tool's subject.
type Request struct {
	// CallID identifies the call; a service that acts on something outside
	// itself should use it as an idempotency key.
	CallID string `json:"call_id"`
	// Args is the call's arguments: a JSON object that matched the tool's
	// schema before anyone was asked to approve the call.
	Args json.RawMessage `json:"args"`
	// Deadline is when Tollgate stops waiting for the reply (RFC 3339).
	// A reply after it is lost and the call is reported as uncertain.
	Deadline time.Time `json:"deadline"`
	// Context is a read-only view of the turn's verified TurnContext.
	Context ContextView `json:"context"`
}

// ContextView is what a tool service learns of the turn a call belongs to:
// a copy of the sealed TurnContext's fields, made by Tollgate for each
// request. Nothing in a reply can change Tollgate's record of it.
type ContextView struct {
	TurnID        string        `json:"turn_id"`
	SessionID     string        `json:"session_id"`
	Transport     string        `json:"transport"`
	Requester     RequesterView `json:"requester"`
	Channel       ChannelView   `json:"channel"`
	Audience      string        `json:"audience"`
	TrustBoundary string        `json:"trust_boundary"`
}

// RequesterView is the person or automation whose turn it is.
type RequesterView struct {
	// Principal is "<transport>:<id>", the requester's identity across
	// transports (what the policy's deciders name).
	Principal string `json:"principal"`
	ID        string `json:"id"` // the sender's id on its transport
	Display   string `json:"display,omitempty"`
	Kind      string `json:"kind"` // user, bot or service
	Verified  bool   `json:"verified"`
}

// ChannelView is where the turn was asked.
type ChannelView struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"` // dm, private or public
	Thread string `json:"thread,omitempty"`
}

// View returns the view of tc sent to tool services.
func View(tc *schemas.TurnContext) ContextView {
	r := tc.Requester
	return ContextView{
		TurnID: tc.TurnID, SessionID: tc.SessionID, Transport: tc.Transport,
		Requester: RequesterView{Principal: r.Principal, ID: r.SenderID, Display: r.Display, Kind: string(r.Kind), Verified: r.Verified},
		Channel:   ChannelView{ID: tc.Channel.ID, Kind: string(tc.Channel.Kind), Thread: tc.Channel.Thread},
		Audience:  string(tc.Audience), TrustBoundary: tc.TrustBoundary,
	}
}

// Tool is one tool of a NATS tool service: a tools.Tool, tools.Describer
// and tools.Retryable.
type Tool struct {
	p       *Provider
	spec    tools.Spec
	subject string
	preview string // the preview endpoint's subject, "" for none
}

// Name implements tools.Tool.
func (t *Tool) Name() string { return t.spec.Name }

// Spec implements tools.Describer.
func (t *Tool) Spec() tools.Spec {
	s := t.spec
	s.InputSchema = slices.Clone(s.InputSchema)
	return s
}

// RetrySafe implements tools.Retryable, as the service's metadata says.
func (t *Tool) RetrySafe() bool { return t.spec.RetrySafe }

// Subject is the endpoint subject calls are sent to.
func (t *Tool) Subject() string { return t.subject }

// Run implements tools.Tool: one request to the tool's subject, the first
// reply taken. It returns:
//
//   - the reply body (invalid UTF-8 replaced) when the reply carries
//     HeaderCallID equal to c.CallID and no service error;
//   - a plain error (the tool ran and failed: an `error` result) when the
//     reply is a service error (headers Nats-Service-Error,
//     Nats-Service-Error-Code);
//   - an error coded TOOL_REPLY_INVALID wrapping tools.ErrUncertain when
//     the reply cannot be trusted as this call's answer: it names another
//     call or none, or its body is over MaxReplyBytes;
//   - an error coded EXECUTION_UNCERTAIN wrapping tools.ErrUncertain when
//     the request went out and no reply came before ctx's deadline (or
//     CallTimeout, without one), or ctx was cancelled, or the connection
//     failed while waiting;
//   - an error coded TOOL_UNAVAILABLE wrapping tools.ErrUnavailable when
//     the request certainly reached no tool: no service listens on the
//     subject (no responders), or it could not be sent (connection closed
//     or draining, request over the server's payload limit).
//
// The request carries the trace context of ctx's span (the call's span)
// in W3C traceparent and tracestate headers (package tracing), so that a
// service in any language can continue the trace.
//
// It never sends the request twice.
func (t *Tool) Run(ctx context.Context, c tools.Call) (string, error) {
	if c.Context == nil {
		return "", schemas.Errorf(schemas.CodeTurnContextMissing, "tool %s: no turn context: %w", t.spec.Name, tools.ErrUnavailable)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.p.o.CallTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	body, err := json.Marshal(Request{CallID: c.CallID, Args: json.RawMessage(c.Args), Deadline: deadline.UTC(), Context: View(c.Context)})
	if err != nil {
		return "", t.p.outcome("error", fmt.Errorf("tool %s: encode request: %w", t.spec.Name, err))
	}
	if t.p.nc.IsClosed() || t.p.nc.IsDraining() {
		return "", t.p.outcome("unavailable", schemas.Errorf(schemas.CodeToolUnavailable, "tool %s: connection closed: %w", t.spec.Name, tools.ErrUnavailable))
	}
	msg := &nats.Msg{Subject: t.subject, Data: body, Header: tracing.Inject(ctx, nats.Header{HeaderCallID: []string{c.CallID}})}
	reply, err := t.p.nc.RequestMsgWithContext(ctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return "", t.p.outcome("unavailable", schemas.Errorf(schemas.CodeToolUnavailable, "tool %s: no service answers on %s: %w", t.spec.Name, t.subject, tools.ErrUnavailable))
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrConnectionDraining):
		// Refused by the client before anything was sent.
		return "", t.p.outcome("unavailable", schemas.Errorf(schemas.CodeToolUnavailable, "tool %s: request not sent (%v): %w", t.spec.Name, err, tools.ErrUnavailable))
	case err != nil:
		return "", t.p.outcome("uncertain", schemas.Errorf(schemas.CodeExecutionUncertain,
			"tool %s: no reply on %s before %s (%v); it may have acted: %w", t.spec.Name, t.subject, deadline.UTC().Format(time.RFC3339Nano), err, tools.ErrUncertain))
	}
	return t.reply(c.CallID, reply)
}

// reply applies the reply rules of Run to the first reply.
func (t *Tool) reply(callID string, m *nats.Msg) (string, error) {
	if got := m.Header.Get(HeaderCallID); got != callID {
		return "", t.p.outcome("reply_invalid", schemas.Errorf(schemas.CodeToolReplyInvalid,
			"tool %s: the reply's %s is %q, not this call's %q; it may have acted: %w", t.spec.Name, HeaderCallID, got, callID, tools.ErrUncertain))
	}
	if n := len(m.Data); n > t.p.o.MaxReplyBytes {
		return "", t.p.outcome("reply_invalid", schemas.Errorf(schemas.CodeToolReplyInvalid,
			"tool %s: reply of %d bytes is over the limit of %d; it may have acted: %w", t.spec.Name, n, t.p.o.MaxReplyBytes, tools.ErrUncertain))
	}
	out := strings.ToValidUTF8(string(m.Data), "\uFFFD")
	if code, desc := m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader); code != "" || desc != "" {
		err := fmt.Errorf("tool %s: service error %s: %s", t.spec.Name, code, strings.ToValidUTF8(desc, "\uFFFD"))
		if out != "" {
			err = fmt.Errorf("%w: %s", err, out)
		}
		return "", t.p.outcome("error", err)
	}
	t.p.outcome("ok", nil)
	return out, nil
}

// outcome counts a call's outcome and returns err.
func (p *Provider) outcome(kind string, err error) error {
	p.calls.WithLabelValues(kind).Inc()
	return err
}
