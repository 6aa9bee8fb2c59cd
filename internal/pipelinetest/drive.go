// The drivers: what a transport and a decider do to the pipeline (build
// and publish inbound turns and decisions, or accept a turn as the
// gateway does), with the message and decision ids they need.

package pipelinetest

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Call is a proposed tool call.
func Call(tool, args string) schemas.ProposedCall {
	return schemas.ProposedCall{Tool: tool, Args: args}
}

// NextID returns a fresh id with prefix, unique within the process.
func (h *Pipeline) NextID(prefix string) string {
	return prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
}

// Inbound builds a valid inbound message from a verified user on transport
// "cli" in a DM, with a fresh message id.
func (h *Pipeline) Inbound(session, sender string, calls ...schemas.ProposedCall) *schemas.InboundMessage {
	return &schemas.InboundMessage{
		Transport: "cli", MessageID: h.NextID("m"), SessionID: session,
		Sender:  schemas.Sender{ID: sender, Display: sender, Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-" + sender, Kind: schemas.ChannelDM},
		Text:    "please", Calls: calls, SentAt: time.Now().UTC(),
	}
}

// Send publishes m on its transport's inbound subject as a transport would
// (message id "transport:message_id") and returns the turn id it becomes.
func (h *H) Send(m *schemas.InboundMessage) string {
	h.T.Helper()
	h.Publish(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), m)
	return schemas.TurnID(m.Transport, m.MessageID)
}

// Publish encodes r and publishes it with msgID ("" for none), returning its
// stream sequence.
func (h *H) Publish(subject, msgID string, r schemas.Record) uint64 {
	h.T.Helper()
	data, err := schemas.Encode(r)
	if err != nil {
		h.T.Fatalf("pipelinetest: encode %T: %v", r, err)
	}
	return h.PublishRaw(subject, msgID, data, nil)
}

// PublishRaw publishes data as is and returns its stream sequence.
func (h *H) PublishRaw(subject, msgID string, data []byte, hdr nats.Header) uint64 {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := h.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr}, opts...)
	if err != nil {
		h.T.Fatalf("pipelinetest: publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// Decision builds a decision by sender on transport (a verified user).
func (h *Pipeline) Decision(approvalID, option, transport, sender string) *schemas.Decision {
	return &schemas.Decision{
		DecisionID: h.NextID("d"), ApprovalID: approvalID, Transport: transport,
		Decider: schemas.Sender{ID: sender, Kind: schemas.SenderUser, Verified: true},
		Option:  option, SentAt: time.Now().UTC(),
	}
}

// Submit publishes d on its approval's decision subject (message id: the
// decision id) and returns its stream sequence.
func (h *H) Submit(d *schemas.Decision) uint64 {
	h.T.Helper()
	return h.Publish(topology.DecisionSubject(d.Transport, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), d)
}

// Decide submits option on approvalID as sender on transport "cli" and
// returns the decision.
func (h *H) Decide(approvalID, option, sender string) *schemas.Decision {
	h.T.Helper()
	d := h.Decision(approvalID, option, "cli", sender)
	h.Submit(d)
	return d
}

// Accept returns the accepted turn that ingest would publish for m under
// the harness's policy, its context sealed with the harness's keys, for
// tests that play the ingest stage themselves.
func (h *H) Accept(m *schemas.InboundMessage) *schemas.AcceptedTurn {
	h.T.Helper()
	at, err := ingest.Accept(m, h.Policy, schemas.Provenance{StreamSeq: 1, ReceivedAt: time.Now().UTC(), IngestedBy: "test"})
	if err != nil {
		h.T.Fatalf("pipelinetest: accept: %v", err)
	}
	if err := h.Keys.Seal(at.Context); err != nil {
		h.T.Fatalf("pipelinetest: seal: %v", err)
	}
	return at
}

// requestLog records the requests sent on tollgate.decide.> (a decision
// sent to the approver's service, which no stream keeps), as a core
// subscriber hears them.
type requestLog struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

// recordDecisionRequests subscribes on nc until the test ends.
func recordDecisionRequests(t testing.TB, nc *nats.Conn) *requestLog {
	t.Helper()
	l := &requestLog{}
	sub, err := nc.Subscribe(topology.SubjectDecide+">", func(m *nats.Msg) {
		l.mu.Lock()
		l.msgs = append(l.msgs, m)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("pipelinetest: record decision requests: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("pipelinetest: record decision requests: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// SentDecisions are the decisions sent on approvalID by transport: those
// TOLLGATE_DECISIONS holds on its subject, then those sent as requests to
// the approver (pipeline/submit), each decision id once (a request no
// approver answered is stored on the stream too), in that order.
func (h *H) SentDecisions(transport, approvalID string) []*schemas.Decision {
	h.T.Helper()
	out := DecodeAll[schemas.Decision](h.T, h.Messages(topology.StreamDecisions, topology.DecisionSubject(transport, approvalID)))
	seen := map[string]bool{}
	for _, d := range out {
		seen[d.DecisionID] = true
	}
	subj := topology.DecideSubject(transport, approvalID)
	h.requests.mu.Lock()
	msgs := slices.Clone(h.requests.msgs)
	h.requests.mu.Unlock()
	for _, m := range msgs {
		if m.Subject != subj {
			continue
		}
		d, err := schemas.Decode[schemas.Decision](m.Data)
		if err != nil {
			h.T.Fatalf("pipelinetest: a decision request on %s does not decode: %v", subj, err)
		}
		if !seen[d.DecisionID] {
			seen[d.DecisionID] = true
			out = append(out, d)
		}
	}
	return out
}

// WaitDecisionService waits until an approver answers on its decision
// service (micro's ping of approver.DecideService): from then on a
// decision sent with pipeline/submit is answered, not stored on the
// stream for want of an approver.
func (h *H) WaitDecisionService() {
	h.T.Helper()
	jstest.Eventually(h.T, h.wait, "the approver's decision service answers", func() bool {
		_, err := h.JS.Conn().Request("$SRV.PING."+approver.DecideService, nil, time.Second)
		return err == nil
	})
}
