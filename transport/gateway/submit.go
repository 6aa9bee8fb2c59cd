package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// SubmitRequest is the body of POST /v1/turns: one inbound message.
type SubmitRequest struct {
	SessionID string `json:"session_id"`
	// MessageID names the message on the key's transport; a request with
	// the same message id is the same turn. Derived from the key and the
	// Idempotency-Key by the HTTP handler (idempotentMessageID); random
	// when empty.
	MessageID string    `json:"-"`
	Sender    SenderIn  `json:"sender"`
	Channel   ChannelIn `json:"channel"`
	Text      string    `json:"text"`
	Calls     []CallIn  `json:"calls"`
}

// SenderIn is who sent the message (or, in a decision, who decided).
type SenderIn struct {
	ID      string `json:"id"`
	Display string `json:"display,omitempty"`
	// Kind is user (default), bot or service.
	Kind string `json:"kind,omitempty"`
	// Verified defaults to the key's vouch_verified; only a vouching key
	// may set it true.
	Verified *bool `json:"verified,omitempty"`
	Strong   bool  `json:"strong,omitempty"`
}

// ChannelIn is where the message was sent; default a DM "dm-<sender id>".
type ChannelIn struct {
	ID     string `json:"id,omitempty"`
	Kind   string `json:"kind,omitempty"` // dm (default), private or public
	Thread string `json:"thread,omitempty"`
}

// CallIn is one proposed tool call; Args is a JSON object.
type CallIn struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args,omitempty"`
}

// SubmitResult is what submit did.
type SubmitResult struct {
	TurnID    string `json:"turn_id"`
	MessageID string `json:"message_id"`
	SessionID string `json:"session_id"`
	Transport string `json:"transport"`
	// Duplicate: an earlier identical request was already stored; nothing
	// new was published.
	Duplicate bool `json:"duplicate"`
}

// digestHeader carries the request digest on the stored inbound message,
// so that a retry can be told from a different request with the same
// message id.
const digestHeader = "Tollgate-Request-Digest"

// sender builds the wire sender of in under key.
func sender(key *Key, in SenderIn) (schemas.Sender, error) {
	verified := key.VouchVerified
	if in.Verified != nil {
		if *in.Verified && !key.VouchVerified {
			return schemas.Sender{}, errorf(http.StatusForbidden, CodeScopeMissing, "API key %s may not vouch for senders as verified", key.ID)
		}
		verified = *in.Verified
	}
	kind := in.Kind
	if kind == "" {
		kind = string(schemas.SenderUser)
	}
	return schemas.Sender{ID: in.ID, Display: in.Display, Kind: schemas.SenderKind(kind), Verified: verified, Strong: verified && in.Strong}, nil
}

// inbound builds the InboundMessage of req under key.
func inbound(key *Key, req SubmitRequest, now time.Time) (*schemas.InboundMessage, error) {
	snd, err := sender(key, req.Sender)
	if err != nil {
		return nil, err
	}
	ch := schemas.Channel{ID: req.Channel.ID, Kind: schemas.ChannelKind(req.Channel.Kind), Thread: req.Channel.Thread}
	if ch.Kind == "" {
		ch.Kind = schemas.ChannelDM
	}
	if ch.ID == "" {
		ch.ID = "dm-" + req.Sender.ID
	}
	calls := make([]schemas.ProposedCall, len(req.Calls))
	for i, c := range req.Calls {
		calls[i] = schemas.ProposedCall{Tool: c.Tool, Args: string(c.Args)}
	}
	return &schemas.InboundMessage{
		Transport: key.Transport, MessageID: req.MessageID, SessionID: req.SessionID,
		Sender: snd, Channel: ch, Text: req.Text, Calls: calls, SentAt: now.UTC(),
	}, nil
}

// requestDigest is the digest of what a message asks for: every field but
// its send time, with the calls' arguments canonical (admitted messages
// have canonical arguments).
func requestDigest(m *schemas.InboundMessage) string {
	calls := make([][2]string, len(m.Calls))
	for i, c := range m.Calls {
		canon, _, _ := schemas.CanonicalArgs(c.Args)
		calls[i] = [2]string{c.Tool, canon}
	}
	b, _ := json.Marshal([]any{m.Transport, m.MessageID, m.SessionID, m.Sender, m.Channel, m.Text, calls})
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// submit turns req into an InboundMessage of key's transport, checks it
// with the admission rule ingest applies (policy.(*Policy).Admit: a
// refusal is a 4xx *apiError with its reason code and nothing is published), and publishes it with
// msg id topology.InboundMsgID. The turn id is TurnID(transport, message
// id). A request whose message id was already used answers the same turn
// (Duplicate) if it asks for the same thing, and 409
// IDEMPOTENCY_KEY_REUSED otherwise; the two are told apart by the request
// digest stored with the first message, found through its batch's
// provenance or the stream's duplicate acknowledgement.
func (s *Server) submit(ctx context.Context, key *Key, req SubmitRequest) (SubmitResult, error) {
	if err := s.ownIdentities(key, req); err != nil {
		return SubmitResult{}, err
	}
	// A request without a message id gets a fresh random one, which no
	// earlier turn can have: it needs no look for an existing turn.
	fresh := req.MessageID == ""
	if fresh {
		req.MessageID = newMessageID()
	}
	msg, err := inbound(key, req, s.cfg.Now())
	if err != nil {
		return SubmitResult{}, err
	}
	subject := topology.InboundSubject(key.Transport, req.SessionID)
	data, err := schemas.Encode(msg)
	if err == nil {
		_, err = s.cfg.Policy.Admit(subject, data, schemas.Provenance{})
	}
	if err != nil {
		return SubmitResult{}, codedInput(err)
	}
	res := SubmitResult{TurnID: schemas.TurnID(key.Transport, req.MessageID), MessageID: req.MessageID, SessionID: req.SessionID, Transport: key.Transport}
	digest := requestDigest(msg)

	// A turn that exists already: compare with the message it came from.
	var b *schemas.BatchRecord
	err = store.ErrNotFound
	if !fresh {
		b, _, err = s.store.Batches.Get(ctx, res.TurnID)
	}
	switch {
	case err == nil:
		if b.Context != nil && b.Context.Provenance.StreamSeq != 0 {
			if err := s.sameRequest(ctx, b.Context.Provenance.StreamSeq, digest); err != nil {
				return SubmitResult{}, err
			}
		}
		res.Duplicate = true
		return res, nil
	case !errors.Is(err, store.ErrNotFound):
		return SubmitResult{}, unavailable(err)
	}

	sctx, cancel := context.WithTimeout(ctx, storeWait)
	defer cancel()
	ack, err := bus.Store(sctx, s.cfg.JS, subject, topology.InboundMsgID(key.Transport, req.MessageID), data,
		nats.Header{digestHeader: []string{digest}}, bus.WithAttemptTimeout(storeAttempt))
	switch {
	case schemas.Permanent(err):
		return SubmitResult{}, codedInput(err)
	case err != nil:
		return SubmitResult{}, unavailable(err)
	}
	if ack.Duplicate {
		if err := s.sameRequest(ctx, ack.Sequence, digest); err != nil {
			return SubmitResult{}, err
		}
		res.Duplicate = true
	}
	return res, nil
}

// storeWait bounds how long a submission keeps trying to store its
// message (bus.Store: each attempt bounded by storeAttempt, one that gets
// no answer made again, as across a stream leader's election) before it
// answers 503 UNAVAILABLE; a client that sends the same message id again
// then finds it stored, or stores it. Variables for tests.
var (
	storeWait    = 15 * time.Second
	storeAttempt = bus.DefaultAttemptTimeout
)

// Sessions reserved to a key. The MCP and hook sessions of a key carry its
// id ("mcp:<key id>", "mcp:<key id>:<Tollgate-Session>",
// "claude:<key id>:<Claude Code session_id>"): only that key submits in
// them, so another key of the transport can neither queue a turn ahead of
// its calls nor plant a turn its calls would join (docs/security.md, "One
// key's calls are its own").
const (
	mcpSessionPrefix    = "mcp:"
	claudeSessionPrefix = "claude:"
)

// sessionOwner returns the id of the key session is reserved to, and
// whether it is reserved: a session starting "mcp:" or "claude:" is, and
// its owner is the segment up to the next ':' (possibly empty, or no
// key's: then no key may use it).
func sessionOwner(session string) (string, bool) {
	rest, ok := strings.CutPrefix(session, mcpSessionPrefix)
	if !ok {
		if rest, ok = strings.CutPrefix(session, claudeSessionPrefix); !ok {
			return "", false
		}
	}
	owner, _, _ := strings.Cut(rest, ":")
	return owner, true
}

// ownIdentities refuses a request of key that names another key: a
// session reserved to another key (403 SESSION_RESERVED), or as sender the
// id of another API key of key's transport (403 SENDER_RESERVED: the
// requester of that key's MCP and hook turns, "<transport>:<key id>", is
// that key alone).
func (s *Server) ownIdentities(key *Key, req SubmitRequest) error {
	if owner, ok := sessionOwner(req.SessionID); ok && owner != key.ID {
		return errorf(http.StatusForbidden, CodeSessionReserved, "session %q is reserved to the MCP and hook calls of API key %q: use a session of your own", req.SessionID, owner)
	}
	if k, ok := s.keys[req.Sender.ID]; ok && k.ID != key.ID && k.Transport == key.Transport {
		return errorf(http.StatusForbidden, CodeSenderReserved, "sender id %q is the id of another API key of transport %s: a key sends only as itself or its users", req.Sender.ID, key.Transport)
	}
	return nil
}

// idempotentMessageID is the message id of a POST /v1/turns request
// with an Idempotency-Key: "k-" + the first 32 hex digits of H("turn",
// transport, key id, Idempotency-Key). It is namespaced by the key, as a
// decision's id is: the same value sent by another key (a rotated one
// included) is another turn, and no value sent here produces the id of
// another key's turn, nor of an MCP or hook call ("mcp-…", "hook-…").
func idempotentMessageID(key *Key, idem string) string {
	return "k-" + hashParts("turn", key.Transport, key.ID, idem)[:32]
}

// newMessageID is a random message id, for a request without an
// Idempotency-Key.
func newMessageID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "m-" + hex.EncodeToString(b)
}

// sameRequest checks that the inbound message stored at seq carries
// digest. A message without the header (published by another client with
// the same id) is not the same request.
func (s *Server) sameRequest(ctx context.Context, seq uint64, digest string) error {
	stored, err := s.inbound.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // aged out of the stream: nothing left to compare with
	}
	if err != nil {
		return unavailable(err)
	}
	if stored.Header.Get(digestHeader) != digest {
		return errorf(http.StatusConflict, CodeIdempotencyKeyReused, "this Idempotency-Key was used for a different request")
	}
	return nil
}

// codedInput maps a refusal of the input (a coded error) to 4xx.
func codedInput(err error) error {
	code := schemas.CodeOf(err)
	if code == "" {
		code = schemas.CodeInvalidInput
	}
	status := http.StatusUnprocessableEntity
	if code == schemas.CodePayloadTooLarge {
		status = http.StatusRequestEntityTooLarge
	}
	return &apiError{Status: status, Code: code, Detail: err.Error()}
}

// unavailable is a failure to talk to the bus.
func unavailable(err error) error {
	return &apiError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: fmt.Sprintf("the bus did not answer: %v", err)}
}
