package ingest_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

const ingestPolicy = `{
  "version": "ingest-test",
  "tools": {"echo": {"approval": "never"}},
  "transports": {
    "cli":     {"trust_boundary": "local", "interactive": true},
    "webhook": {"trust_boundary": "external", "interactive": false},
    "slack":   {"trust_boundary": "acme-corp", "interactive": true}
  },
  "default_transport": {"trust_boundary": "elsewhere", "interactive": false}
}`

var (
	sentAt     = time.Date(2026, 2, 3, 4, 5, 6, 7, time.UTC)
	receivedAt = time.Date(2026, 2, 3, 4, 5, 7, 0, time.UTC)
)

func inbound(transport string, kind schemas.SenderKind, ch schemas.ChannelKind) *schemas.InboundMessage {
	return &schemas.InboundMessage{
		V: schemas.InboundVersion, Transport: transport, MessageID: "m-1", SessionID: "sess",
		Sender:  schemas.Sender{ID: "U1", Display: "Ada", Kind: kind, Verified: true},
		Channel: schemas.Channel{ID: "C1", Kind: ch, Thread: "th"},
		Text:    "hi", SentAt: sentAt,
		Calls: []schemas.ProposedCall{{Tool: "echo", Args: `{ "text" : "x", "a": 1 }`}, {Tool: "write_file", Args: ""}},
	}
}

func mustPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(ingestPolicy))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAnUnverifiedUserIsNotInteractive(t *testing.T) {
	m := inbound("cli", schemas.SenderUser, schemas.ChannelDM)
	m.Sender.Verified = false
	at, err := ingest.Accept(m, mustPolicy(t), schemas.Provenance{ReceivedAt: receivedAt})
	if err != nil {
		t.Fatal(err)
	}
	// The approver rejects unverified deciders, so a prompt to this
	// requester could never be answered by them.
	if at.Context.Interactive || at.Context.Requester.Verified {
		t.Fatalf("context %+v: an unverified requester must not be interactive", at.Context)
	}
}

func TestAcceptBuildsTheTurnContextOnce(t *testing.T) {
	p := mustPolicy(t)
	tests := []struct {
		name        string
		transport   string
		kind        schemas.SenderKind
		channel     schemas.ChannelKind
		audience    schemas.Audience
		boundary    string
		interactive bool
	}{
		{"a DM from a CLI user is personal, local and interactive", "cli", schemas.SenderUser, schemas.ChannelDM, schemas.AudiencePersonal, "local", true},
		{"a private channel is a team audience", "slack", schemas.SenderUser, schemas.ChannelPrivate, schemas.AudienceTeam, "acme-corp", true},
		{"a public channel is a public audience", "slack", schemas.SenderUser, schemas.ChannelPublic, schemas.AudiencePublic, "acme-corp", true},
		{"a bot is never interactive", "slack", schemas.SenderBot, schemas.ChannelDM, schemas.AudiencePersonal, "acme-corp", false},
		{"a service is never interactive", "cli", schemas.SenderService, schemas.ChannelDM, schemas.AudiencePersonal, "local", false},
		{"a non-interactive transport makes no user interactive", "webhook", schemas.SenderUser, schemas.ChannelDM, schemas.AudiencePersonal, "external", false},
		{"an unknown transport gets the policy's default transport", "teams", schemas.SenderUser, schemas.ChannelPrivate, schemas.AudienceTeam, "elsewhere", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := inbound(tc.transport, tc.kind, tc.channel)
			at, err := ingest.Accept(m, p, schemas.Provenance{StreamSeq: 42, ReceivedAt: receivedAt, IngestedBy: "ingest@x"})
			if err != nil {
				t.Fatal(err)
			}
			turn := schemas.TurnID(tc.transport, "m-1")
			c := at.Context
			if at.TurnID != turn || c.TurnID != turn || c.SessionID != "sess" || c.V != schemas.TurnContextVersion {
				t.Fatalf("ids: turn %s ctx %+v", at.TurnID, c)
			}
			wantReq := schemas.Requester{Principal: tc.transport + ":U1", SenderID: "U1", Display: "Ada", Kind: tc.kind, Verified: true}
			if c.Requester != wantReq {
				t.Fatalf("requester %+v, want %+v", c.Requester, wantReq)
			}
			if c.Transport != tc.transport || c.Channel != m.Channel || c.Audience != tc.audience || c.TrustBoundary != tc.boundary || c.Interactive != tc.interactive {
				t.Fatalf("context %+v, want audience %s boundary %s interactive %v", c, tc.audience, tc.boundary, tc.interactive)
			}
			wantProv := schemas.Provenance{Transport: tc.transport, MessageID: "m-1", StreamSeq: 42, ReceivedAt: receivedAt, IngestedBy: "ingest@x"}
			if c.Provenance != wantProv || !c.CreatedAt.Equal(receivedAt) || !at.AcceptedAt.Equal(receivedAt) {
				t.Fatalf("provenance %+v created %v, want %+v at %v", c.Provenance, c.CreatedAt, wantProv, receivedAt)
			}
			if err := c.CheckFor(turn); err != nil {
				t.Fatalf("built context does not check: %v", err)
			}
			wantCalls := []schemas.ToolCall{
				{CallID: turn + "-0", Index: 0, Tool: "echo", Args: `{"a":1,"text":"x"}`, ArgsDigest: schemas.ArgsDigest(`{"a":1,"text":"x"}`)},
				{CallID: turn + "-1", Index: 1, Tool: "write_file", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`)},
			}
			if fmt.Sprint(at.Calls) != fmt.Sprint(wantCalls) {
				t.Fatalf("calls %+v, want %+v", at.Calls, wantCalls)
			}
		})
	}
}

func TestAcceptIsDeterministic(t *testing.T) {
	p := mustPolicy(t)
	prov := schemas.Provenance{StreamSeq: 7, ReceivedAt: receivedAt, IngestedBy: "i"}
	a, err := ingest.Accept(inbound("cli", schemas.SenderUser, schemas.ChannelDM), p, prov)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ingest.Accept(inbound("cli", schemas.SenderUser, schemas.ChannelDM), p, prov)
	if err != nil {
		t.Fatal(err)
	}
	ea, _ := schemas.Encode(a)
	eb, _ := schemas.Encode(b)
	if !bytes.Equal(ea, eb) {
		t.Fatal("the same message and provenance gave different accepted turns")
	}
	// Without a stream timestamp, the message's own time is used, never the clock.
	c, err := ingest.Accept(inbound("cli", schemas.SenderUser, schemas.ChannelDM), p, schemas.Provenance{})
	if err != nil || !c.Context.CreatedAt.Equal(sentAt) || !c.Context.Provenance.ReceivedAt.Equal(sentAt) {
		t.Fatalf("created %v (%v), want the sent time %v", c.Context.CreatedAt, err, sentAt)
	}
}

func TestAcceptRejectsInputThatCannotBecomeATurn(t *testing.T) {
	p := mustPolicy(t)
	tests := []struct {
		name   string
		mangle func(m *schemas.InboundMessage)
		code   schemas.Code
	}{
		{"a channel kind with no audience", func(m *schemas.InboundMessage) { m.Channel.Kind = "group" }, schemas.CodeInvalidInput},
		{"arguments that are not JSON", func(m *schemas.InboundMessage) { m.Calls[0].Args = `{"text":` }, schemas.CodeArgsInvalidJSON},
		{"arguments that are a JSON array", func(m *schemas.InboundMessage) { m.Calls[1].Args = `[1,2]` }, schemas.CodeArgsInvalidJSON},
		{"arguments that are JSON null", func(m *schemas.InboundMessage) { m.Calls[1].Args = `null` }, schemas.CodeArgsInvalidJSON},
		{"two JSON objects", func(m *schemas.InboundMessage) { m.Calls[0].Args = `{}{}` }, schemas.CodeArgsInvalidJSON},
		{"arguments over the size limit", func(m *schemas.InboundMessage) {
			m.Calls[0].Args = `{"text":"` + strings.Repeat("x", schemas.MaxArgsBytes) + `"}`
		}, schemas.CodePayloadTooLarge},
		{"no sender id", func(m *schemas.InboundMessage) { m.Sender.ID = "" }, schemas.CodeTurnContextInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := inbound("cli", schemas.SenderUser, schemas.ChannelDM)
			tc.mangle(m)
			at, err := ingest.Accept(m, p, schemas.Provenance{})
			if at != nil || schemas.CodeOf(err) != tc.code {
				t.Fatalf("got %v %v, want code %s", at, err, tc.code)
			}
		})
	}
}

func TestAdmitIsIngestsAdmissionRule(t *testing.T) {
	p := mustPolicy(t)
	own := topology.InboundSubject("cli", "sess")
	encoded := func(mutate func(m *schemas.InboundMessage)) []byte {
		m := inbound("cli", schemas.SenderUser, schemas.ChannelDM)
		mutate(m)
		b, err := msgpack.Marshal(m) // not schemas.Encode: that would refuse most rows
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	call := func(tool, args string) func(m *schemas.InboundMessage) {
		return func(m *schemas.InboundMessage) { m.Calls = []schemas.ProposedCall{{Tool: tool, Args: args}} }
	}
	tests := []struct {
		name    string
		subject string
		data    []byte
		code    schemas.Code // "" is admitted
	}{
		{"a well-formed message on its own subject is admitted", own, encoded(func(*schemas.InboundMessage) {}), ""},
		{"a call without arguments is admitted", own, encoded(call("echo", "")), ""},
		{"bytes that are not msgpack", own, []byte("hello, tollgate"), schemas.CodeMalformed},
		{"an empty payload", own, nil, schemas.CodeMalformed},
		{"an unknown schema version", own, encoded(func(m *schemas.InboundMessage) { m.V = 2 }), schemas.CodeSchemaVersionUnsupported},
		{"a tool name with a space", own, encoded(call("Bad Tool", `{}`)), schemas.CodeInvalidInput},
		{"a tool name with a path in it", own, encoded(call("echo/../x", `{}`)), schemas.CodeInvalidInput},
		{"arguments that are not JSON", own, encoded(call("echo", `{"text":`)), schemas.CodeArgsInvalidJSON},
		{"arguments that are a JSON array", own, encoded(call("echo", `[1,2]`)), schemas.CodeArgsInvalidJSON},
		{"arguments over the size limit", own, encoded(call("echo", `{"text":"`+strings.Repeat("x", schemas.MaxArgsBytes)+`"}`)), schemas.CodePayloadTooLarge},
		{"a channel kind with no audience", own, encoded(func(m *schemas.InboundMessage) { m.Channel.Kind = "group" }), schemas.CodeInvalidInput},
		{"a session that differs from the subject it arrived on", topology.InboundSubject("cli", "another"),
			encoded(func(*schemas.InboundMessage) {}), schemas.CodeInvalidInput},
		{"a transport that differs from the subject it arrived on", topology.InboundSubject("webhook", "sess"),
			encoded(func(*schemas.InboundMessage) {}), schemas.CodeInvalidInput},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			at, err := ingest.Admit(tc.subject, tc.data, p, schemas.Provenance{StreamSeq: 3, ReceivedAt: receivedAt})
			if tc.code == "" {
				if err != nil || at.TurnID != schemas.TurnID("cli", "m-1") || at.Context.Provenance.StreamSeq != 3 {
					t.Fatalf("Admit = %+v, %v; want turn %s", at, err, schemas.TurnID("cli", "m-1"))
				}
				return
			}
			var coded *schemas.Error
			if at != nil || !errors.As(err, &coded) || coded.Code != tc.code {
				t.Fatalf("Admit = %+v, %v; want a *schemas.Error with code %s", at, err, tc.code)
			}
			if strings.Count(err.Error(), string(tc.code)) != 1 {
				t.Fatalf("error %q names its code more than once", err)
			}
		})
	}
}

// TestEachTurnJoinsItsSessionsOrderOnce: ingest appends every turn it
// accepts to its session's order, each entry naming the one before it and
// carrying the session's arrival watermark (the inbound sequence). The
// same message sent again under another message id (a transport's retry)
// is one entry more of the same turn, which raises the watermark (and
// runs nothing again).
func TestEachTurnJoinsItsSessionsOrderOnce(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: ingestPolicy})
	var turns []string
	var seqs []uint64
	for i := range 3 {
		m := h.Inbound("ordered", "alice", pt.Call("echo", `{"text":"in order"}`))
		data, err := schemas.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		turn := schemas.TurnID("cli", m.MessageID)
		turns = append(turns, turn)
		seqs = append(seqs, h.PublishRaw(topology.InboundSubject("cli", m.SessionID), m.MessageID, data, nil))
		h.WaitTerminal(turn)
		if i == 1 {
			// The same message again under another message id (a
			// transport's retry): the same turn, a repeated entry.
			turns = append(turns, turn)
			seqs = append(seqs, h.PublishRaw(topology.InboundSubject("cli", m.SessionID), m.MessageID+"-again", data, nil))
			h.WaitConsumed(pt.Ingest, seqs[len(seqs)-1])
		}
	}
	other := h.Send(h.Inbound("other", "bob", pt.Call("echo", `{"text":"elsewhere"}`)))
	h.WaitTerminal(other)
	h.WaitIdle(pt.Ingest, pt.Executor)

	key := schemas.SessionKeyOf(h.WaitBatch(turns[0], "any", func(*schemas.BatchRecord) bool { return true }).Context)
	entries := h.Messages(topology.StreamTurns, topology.OrderWildcard(key))
	if len(entries) != len(turns) {
		t.Fatalf("%d entries in the session's order, want %d (one per delivery)", len(entries), len(turns))
	}
	if id := entries[2].Header.Get("Nats-Msg-Id"); id != topology.OrderRepeatMsgID(turns[2], seqs[2]) {
		t.Fatalf("the repeated entry's message id is %q", id)
	}
	if n := len(h.Outcomes(turns[1])); n != 1 {
		t.Fatalf("the repeated turn has %d outcomes, want 1", n)
	}
	for i, m := range entries {
		e, err := turnorder.Stamp(m.Subject, m.Header)
		if err != nil {
			t.Fatal(err)
		}
		want := turnorder.Entry{Kind: topology.OrderExec, Key: key, Turn: turns[i], Arrival: seqs[i]}
		if i > 0 {
			want.After, want.AfterSeq = turns[i-1], entries[i-1].Seq
		}
		if e.Kind != want.Kind || e.Key != want.Key || e.Turn != want.Turn || e.After != want.After || e.AfterSeq != want.AfterSeq || e.Arrival != want.Arrival {
			t.Fatalf("entry %d is %+v, want %+v", i, e, want)
		}
		if e.Repeated() != (i == 2) {
			t.Fatalf("entry %d reads as repeated: %v", i, e.Repeated())
		}
	}
	// Each turn's batch records its place: its first entry, and the turn
	// before that one; the repeated entry places nothing.
	for i, turn := range turns {
		if i == 2 {
			continue
		}
		b := h.Batch(turn)
		if b.OrderSeq != entries[i].Seq || b.OrderAfter != entries[i].Header.Get(topology.HeaderOrderAfter) {
			t.Fatalf("turn %d's batch is placed at %d after %q, want its entry %d after %q",
				i, b.OrderSeq, b.OrderAfter, entries[i].Seq, entries[i].Header.Get(topology.HeaderOrderAfter))
		}
	}
	if b := h.Batch(other); b.OrderSeq == 0 || b.OrderAfter != "" {
		t.Fatalf("another session's first turn is placed at %d after %q, want its entry after none", b.OrderSeq, b.OrderAfter)
	}
}

func TestSameTransportMessageIsOneTurn(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: ingestPolicy})
	m := h.Inbound("dup", "alice", pt.Call("echo", `{"text":"once"}`))
	data, err := schemas.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	// Two deliveries of the same transport message under different
	// Nats-Msg-Ids, as a transport retrying after the dedupe window would.
	seq1 := h.PublishRaw(topology.InboundSubject("cli", m.SessionID), "first", data, nil)
	seq2 := h.PublishRaw(topology.InboundSubject("cli", m.SessionID), "second", data, nil)
	if seq1 == seq2 {
		t.Fatal("second publish was deduplicated by the stream; the test needs two deliveries")
	}
	turn := schemas.TurnID("cli", m.MessageID)
	h.WaitConsumed(pt.Ingest, seq2)
	b, _ := h.WaitTerminal(turn)
	h.WaitIdle(pt.Executor)

	// One entry per delivery in the session's order (the second raises
	// the session's arrival watermark), both of the one turn.
	accepted := pt.DecodeAll[schemas.AcceptedTurn](t, h.Messages(topology.StreamTurns, topology.SubjectTurnOrder+">"))
	if len(accepted) != 2 || accepted[0].TurnID != turn || accepted[1].TurnID != turn {
		t.Fatalf("%d entries, want 2 (one per delivery), both of %s", len(accepted), turn)
	}
	if got := accepted[0].Context.Provenance; got.StreamSeq != seq1 || got.Transport != "cli" || got.MessageID != m.MessageID || got.IngestedBy != "ingest@test" {
		t.Fatalf("provenance %+v, want stream seq %d of the first delivery", got, seq1)
	}
	if b.Context.Provenance.StreamSeq != seq1 || b.Results[0].Output != "once" {
		t.Fatalf("batch %+v", b)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcomes", n)
	}
	if dl := h.DLQ(pt.Ingest); len(dl) != 0 {
		t.Fatalf("dead letters: %v", dl)
	}
}

func TestBadInboundIsDeadLetteredAndIngestKeepsGoing(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: ingestPolicy})
	rawInbound := func(mutate func(m *schemas.InboundMessage)) []byte {
		m := h.Inbound("bad", "alice", pt.Call("echo", `{}`))
		m.V = schemas.InboundVersion
		mutate(m)
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name    string
		subject string
		data    []byte
		code    schemas.Code
	}{
		{"bytes that are not msgpack", topology.InboundSubject("cli", "s1"), []byte("hello, tollgate"), schemas.CodeMalformed},
		{"a msgpack array instead of a map", topology.InboundSubject("cli", "s1"), []byte{0x92, 0x01, 0x02}, schemas.CodeMalformed},
		{"a length claiming more than the payload holds", topology.InboundSubject("cli", "s1"), []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, schemas.CodeMalformed},
		{"an empty payload", topology.InboundSubject("cli", "s1"), nil, schemas.CodeMalformed},
		{"an unknown schema version", topology.InboundSubject("cli", "bad"), rawInbound(func(m *schemas.InboundMessage) { m.V = 2 }), schemas.CodeSchemaVersionUnsupported},
		{"a bad channel kind", topology.InboundSubject("cli", "bad"), rawInbound(func(m *schemas.InboundMessage) { m.Channel.Kind = "broadcast" }), schemas.CodeInvalidInput},
		{"a sender kind that does not exist", topology.InboundSubject("cli", "bad"), rawInbound(func(m *schemas.InboundMessage) { m.Sender.Kind = "admin" }), schemas.CodeInvalidInput},
		{"invalid JSON arguments", topology.InboundSubject("cli", "bad"), rawInbound(func(m *schemas.InboundMessage) { m.Calls[0].Args = "{oops" }), schemas.CodeArgsInvalidJSON},
		{"too many calls", topology.InboundSubject("cli", "bad"), rawInbound(func(m *schemas.InboundMessage) {
			m.Calls = make([]schemas.ProposedCall, schemas.MaxCalls+1)
			for i := range m.Calls {
				m.Calls[i] = pt.Call("echo", `{}`)
			}
		}), schemas.CodePayloadTooLarge},
		{"a session that differs from the subject it arrived on", topology.InboundSubject("cli", "another-session"),
			rawInbound(func(m *schemas.InboundMessage) {}), schemas.CodeInvalidInput},
		{"a transport name that differs from the subject it arrived on", topology.InboundSubject("webhook", "bad"),
			rawInbound(func(m *schemas.InboundMessage) { m.Transport = "cli" }), schemas.CodeInvalidInput},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			seq := h.PublishRaw(tc.subject, "", tc.data, nil)
			dls := h.WaitDLQ(pt.Ingest, i+1)
			dl := dls[len(dls)-1]
			if got := dl.Header.Get(runner.HeaderCode); got != string(tc.code) {
				t.Fatalf("dead letter code %s (%s), want %s", got, dl.Header.Get(runner.HeaderReason), tc.code)
			}
			if !bytes.Equal(dl.Data, tc.data) || dl.Header.Get(runner.HeaderOriginalSeq) != fmt.Sprint(seq) ||
				dl.Header.Get(runner.HeaderStage) != pt.Ingest || dl.Header.Get(runner.HeaderOriginalSubject) != tc.subject {
				t.Fatalf("dead letter %v %q does not carry the original message %d", dl.Header, dl.Data, seq)
			}
			// The next valid message is still accepted and runs.
			turn := h.Send(h.Inbound(fmt.Sprintf("after%d", i), "alice", pt.Call("echo", `{"text":"ok"}`)))
			if b, _ := h.WaitTerminal(turn); b.Results[0].Output != "ok" {
				t.Fatalf("valid message after a dead letter: %+v", b.Results[0])
			}
		})
	}
	h.WaitIdle(pt.Ingest, pt.Executor)
	accepted := h.Messages(topology.StreamTurns, topology.SubjectTurnOrder+">")
	if len(accepted) != len(tests) {
		t.Fatalf("%d accepted turns, want only the %d valid ones", len(accepted), len(tests))
	}
	if got := h.Metric("tollgate_messages_dead_lettered_total", map[string]string{"stage": pt.Ingest}); got != float64(len(tests)) {
		t.Fatalf("dead-lettered metric %v, want %d", got, len(tests))
	}
	if got := h.Metric("tollgate_messages_dead_lettered_total", map[string]string{"stage": pt.Ingest, "code": string(schemas.CodeMalformed)}); got != 4 {
		t.Fatalf("MALFORMED_PAYLOAD dead letters %v, want 4", got)
	}
}

func BenchmarkIngestAccept(b *testing.B) {
	p := mustPolicy(b)
	m := inbound("slack", schemas.SenderUser, schemas.ChannelPrivate)
	prov := schemas.Provenance{StreamSeq: 1, ReceivedAt: receivedAt, IngestedBy: "bench"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ingest.Accept(m, p, prov); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIngestDecodeAcceptEncode(b *testing.B) {
	p := mustPolicy(b)
	data, err := schemas.Encode(inbound("slack", schemas.SenderUser, schemas.ChannelPrivate))
	if err != nil {
		b.Fatal(err)
	}
	prov := schemas.Provenance{StreamSeq: 1, ReceivedAt: receivedAt, IngestedBy: "bench"}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	subject := topology.InboundSubject("slack", "sess")
	for b.Loop() {
		at, err := ingest.Admit(subject, data, p, prov)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := schemas.Encode(at); err != nil {
			b.Fatal(err)
		}
	}
}
