package schemas_test

import (
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
)

// checkBothWays asserts that Encode refuses rec with code want (nothing
// invalid is ever written) and that Decode refuses the same record written
// by someone else (nothing invalid is ever read). want "" means valid.
func checkBothWays[T any, P schemas.Ptr[T]](t *testing.T, rec P, want schemas.Code) {
	t.Helper()
	raw, err := msgpack.Marshal(rec) // bypasses Encode's validation, as a foreign writer would
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	out, encErr := schemas.Encode(rec)
	got, decErr := schemas.Decode[T, P](raw)
	if want == "" {
		if encErr != nil || decErr != nil {
			t.Fatalf("valid record rejected: encode: %v; decode: %v", encErr, decErr)
		}
		if out == nil || got == nil {
			t.Fatalf("valid record produced no output")
		}
		return
	}
	if code := schemas.CodeOf(encErr); code != want {
		t.Errorf("Encode: code %q (%v), want %s", code, encErr, want)
	}
	if out != nil {
		t.Errorf("Encode returned %d bytes with its error", len(out))
	}
	if code := schemas.CodeOf(decErr); code != want {
		t.Errorf("Decode: code %q (%v), want %s", code, decErr, want)
	}
	if got != nil {
		t.Errorf("Decode returned a record with its error")
	}
}

func TestInboundMessageValidation(t *testing.T) {
	calls := func(n int) []schemas.ProposedCall {
		cs := make([]schemas.ProposedCall, n)
		for i := range cs {
			cs[i] = schemas.ProposedCall{Tool: "files.read", Args: "{}"}
		}
		return cs
	}
	cases := []struct {
		name   string
		mutate func(*schemas.InboundMessage)
		want   schemas.Code
	}{
		{"the example is valid", func(*schemas.InboundMessage) {}, ""},
		{"no calls is valid", func(m *schemas.InboundMessage) { m.Calls = nil }, ""},
		{"empty text is valid", func(m *schemas.InboundMessage) { m.Text = "" }, ""},
		{"tabs, newlines and carriage returns in text are valid", func(m *schemas.InboundMessage) { m.Text = "a\tb\r\nc" }, ""},
		{"exactly the maximum number of calls is valid", func(m *schemas.InboundMessage) { m.Calls = calls(schemas.MaxCalls) }, ""},
		{"args of exactly the maximum size are valid", func(m *schemas.InboundMessage) {
			m.Calls[0].Args = strings.Repeat("x", schemas.MaxArgsBytes)
		}, ""},

		{"missing transport", func(m *schemas.InboundMessage) { m.Transport = "" }, schemas.CodeInvalidInput},
		{"upper-case transport", func(m *schemas.InboundMessage) { m.Transport = "Slack" }, schemas.CodeInvalidInput},
		{"transport with a subject wildcard", func(m *schemas.InboundMessage) { m.Transport = "slack.>" }, schemas.CodeInvalidInput},
		{"transport with a dot (two subject tokens)", func(m *schemas.InboundMessage) { m.Transport = "slack.enterprise" }, schemas.CodeInvalidInput},
		{"transport longer than 64 bytes", func(m *schemas.InboundMessage) { m.Transport = strings.Repeat("s", 65) }, schemas.CodeInvalidInput},
		{"missing message id", func(m *schemas.InboundMessage) { m.MessageID = "" }, schemas.CodeInvalidInput},
		{"message id over the id limit", func(m *schemas.InboundMessage) { m.MessageID = strings.Repeat("m", schemas.MaxIDBytes+1) }, schemas.CodePayloadTooLarge},
		{"message id with a newline", func(m *schemas.InboundMessage) { m.MessageID = "m1\nm2" }, schemas.CodeInvalidInput},
		{"message id with a NUL byte", func(m *schemas.InboundMessage) { m.MessageID = "m1\x00" }, schemas.CodeInvalidInput},
		{"missing session id", func(m *schemas.InboundMessage) { m.SessionID = "" }, schemas.CodeInvalidInput},
		{"missing sender id", func(m *schemas.InboundMessage) { m.Sender.ID = "" }, schemas.CodeInvalidInput},
		{"missing sender kind", func(m *schemas.InboundMessage) { m.Sender.Kind = "" }, schemas.CodeInvalidInput},
		{"unknown sender kind", func(m *schemas.InboundMessage) { m.Sender.Kind = "admin" }, schemas.CodeInvalidInput},
		{"sender display with an escape character", func(m *schemas.InboundMessage) { m.Sender.Display = "Ada\x1b[31m" }, schemas.CodeInvalidInput},
		{"sender display over 128 bytes", func(m *schemas.InboundMessage) { m.Sender.Display = strings.Repeat("d", 129) }, schemas.CodePayloadTooLarge},
		{"missing channel id", func(m *schemas.InboundMessage) { m.Channel.ID = "" }, schemas.CodeInvalidInput},
		{"missing channel kind", func(m *schemas.InboundMessage) { m.Channel.Kind = "" }, schemas.CodeInvalidInput},
		{"unknown channel kind", func(m *schemas.InboundMessage) { m.Channel.Kind = "group" }, schemas.CodeInvalidInput},
		{"channel thread with a control character", func(m *schemas.InboundMessage) { m.Channel.Thread = "t\x07" }, schemas.CodeInvalidInput},
		{"text that is not UTF-8", func(m *schemas.InboundMessage) { m.Text = "caf\xe9" }, schemas.CodeInvalidInput},
		{"text with a NUL byte", func(m *schemas.InboundMessage) { m.Text = "hi\x00there" }, schemas.CodeInvalidInput},
		{"text with a C1 control character", func(m *schemas.InboundMessage) { m.Text = "hi\u0085there" }, schemas.CodeInvalidInput},
		{"text over the text limit", func(m *schemas.InboundMessage) { m.Text = strings.Repeat("t", schemas.MaxTextBytes+1) }, schemas.CodePayloadTooLarge},
		{"session id that is not UTF-8", func(m *schemas.InboundMessage) { m.SessionID = "\xff\xfe" }, schemas.CodeInvalidInput},
		{"one call too many", func(m *schemas.InboundMessage) { m.Calls = calls(schemas.MaxCalls + 1) }, schemas.CodePayloadTooLarge},
		{"args one byte over the limit", func(m *schemas.InboundMessage) {
			m.Calls[1].Args = strings.Repeat("x", schemas.MaxArgsBytes+1)
		}, schemas.CodePayloadTooLarge},
		{"missing tool name", func(m *schemas.InboundMessage) { m.Calls[0].Tool = "" }, schemas.CodeInvalidInput},
		{"tool name with a space", func(m *schemas.InboundMessage) { m.Calls[0].Tool = "send email" }, schemas.CodeInvalidInput},
		{"upper-case tool name", func(m *schemas.InboundMessage) { m.Calls[1].Tool = "Files.Read" }, schemas.CodeInvalidInput},
		{"tool name with a slash", func(m *schemas.InboundMessage) { m.Calls[1].Tool = "../shell" }, schemas.CodeInvalidInput},
		{"tool name longer than 64 bytes", func(m *schemas.InboundMessage) { m.Calls[0].Tool = strings.Repeat("t", 65) }, schemas.CodeInvalidInput},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := exampleInbound()
			tc.mutate(m)
			checkBothWays(t, m, tc.want)
		})
	}
}

func TestDecisionValidation(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*schemas.Decision)
		want   schemas.Code
	}{
		{"the example is valid", func(*schemas.Decision) {}, ""},
		{"no channel is valid", func(d *schemas.Decision) { d.Channel = nil }, ""},
		{"no digest and no note are valid", func(d *schemas.Decision) { d.ArgsDigest, d.Note = "", "" }, ""},
		{"deny is valid", func(d *schemas.Decision) { d.Option = schemas.OptionDeny }, ""},

		{"missing decision id", func(d *schemas.Decision) { d.DecisionID = "" }, schemas.CodeInvalidInput},
		{"missing approval id", func(d *schemas.Decision) { d.ApprovalID = "" }, schemas.CodeInvalidInput},
		{"approval id over the id limit", func(d *schemas.Decision) { d.ApprovalID = strings.Repeat("a", schemas.MaxIDBytes+1) }, schemas.CodePayloadTooLarge},
		{"approval id with a control character", func(d *schemas.Decision) { d.ApprovalID = "a-1\r" }, schemas.CodeInvalidInput},
		{"missing transport", func(d *schemas.Decision) { d.Transport = "" }, schemas.CodeInvalidInput},
		{"transport with a space", func(d *schemas.Decision) { d.Transport = "ms teams" }, schemas.CodeInvalidInput},
		{"transport with a dot, which another transport's subject permission would cover", func(d *schemas.Decision) { d.Transport = "slack.enterprise" }, schemas.CodeInvalidInput},
		{"missing option", func(d *schemas.Decision) { d.Option = "" }, schemas.CodeInvalidInput},
		{"option with punctuation", func(d *schemas.Decision) { d.Option = "approve!" }, schemas.CodeInvalidInput},
		{"upper-case option", func(d *schemas.Decision) { d.Option = "APPROVE" }, schemas.CodeInvalidInput},
		{"missing decider id", func(d *schemas.Decision) { d.Decider.ID = "" }, schemas.CodeInvalidInput},
		{"missing decider kind", func(d *schemas.Decision) { d.Decider.Kind = "" }, schemas.CodeInvalidInput},
		{"unknown decider kind", func(d *schemas.Decision) { d.Decider.Kind = "root" }, schemas.CodeInvalidInput},
		{"decider id that is not UTF-8", func(d *schemas.Decision) { d.Decider.ID = "U\xc3" }, schemas.CodeInvalidInput},
		{"channel with an unknown kind", func(d *schemas.Decision) { d.Channel.Kind = "voice" }, schemas.CodeInvalidInput},
		{"channel without an id", func(d *schemas.Decision) { d.Channel.ID = "" }, schemas.CodeInvalidInput},
		{"digest with a newline", func(d *schemas.Decision) { d.ArgsDigest = "sha256:ab\ncd" }, schemas.CodeInvalidInput},
		{"digest over 128 bytes", func(d *schemas.Decision) { d.ArgsDigest = "sha256:" + strings.Repeat("0", 128) }, schemas.CodePayloadTooLarge},
		{"note with a bell character", func(d *schemas.Decision) { d.Note = "ok\a" }, schemas.CodeInvalidInput},
		{"note that is not UTF-8", func(d *schemas.Decision) { d.Note = "ok \xff" }, schemas.CodeInvalidInput},
		{"note over the note limit", func(d *schemas.Decision) { d.Note = strings.Repeat("n", schemas.MaxNoteBytes+1) }, schemas.CodePayloadTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := exampleDecision()
			tc.mutate(d)
			checkBothWays(t, d, tc.want)
		})
	}
}

func TestTurnContextCheck(t *testing.T) {
	cases := []struct {
		name   string
		ctx    func() *schemas.TurnContext
		turnID string
		want   schemas.Code
	}{
		{"the example is usable for its turn", exampleContext, exTurnID, ""},
		{"no context", func() *schemas.TurnContext { return nil }, exTurnID, schemas.CodeTurnContextMissing},
		{"empty context", func() *schemas.TurnContext { return &schemas.TurnContext{} }, exTurnID, schemas.CodeSchemaVersionUnsupported},
		{"version zero", func() *schemas.TurnContext { c := exampleContext(); c.V = 0; return c }, exTurnID, schemas.CodeSchemaVersionUnsupported},
		{"a future version", func() *schemas.TurnContext { c := exampleContext(); c.V = 2; return c }, exTurnID, schemas.CodeSchemaVersionUnsupported},
		{"missing principal", func() *schemas.TurnContext { c := exampleContext(); c.Requester.Principal = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"missing sender id", func() *schemas.TurnContext { c := exampleContext(); c.Requester.SenderID = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"no audience (there is no default)", func() *schemas.TurnContext { c := exampleContext(); c.Audience = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"unknown audience", func() *schemas.TurnContext { c := exampleContext(); c.Audience = "everyone"; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"missing trust boundary", func() *schemas.TurnContext { c := exampleContext(); c.TrustBoundary = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"missing session", func() *schemas.TurnContext { c := exampleContext(); c.SessionID = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"missing turn id", func() *schemas.TurnContext { c := exampleContext(); c.TurnID = ""; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"invalid transport", func() *schemas.TurnContext { c := exampleContext(); c.Transport = "Slack!"; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"transport with a dot", func() *schemas.TurnContext { c := exampleContext(); c.Transport = "slack.x"; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"invalid channel kind", func() *schemas.TurnContext { c := exampleContext(); c.Channel.Kind = "x"; return c }, exTurnID, schemas.CodeTurnContextInvalid},
		{"principal with a control character", func() *schemas.TurnContext {
			c := exampleContext()
			c.Requester.Principal = "slack:U1\x00admin"
			return c
		}, exTurnID, schemas.CodeTurnContextInvalid},
		{"another turn's context", exampleContext, schemas.TurnID(exTransport, "another-message"), schemas.CodeTurnContextMismatch},
		{"a turn id that differs only in case", exampleContext, strings.ToUpper(exTurnID), schemas.CodeTurnContextMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ctx().CheckFor(tc.turnID)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckFor: %v", err)
				}
				if err := tc.ctx().Check(); err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			wantCode(t, err, tc.want)
			if tc.want != schemas.CodeTurnContextMismatch {
				// Check alone must already refuse it.
				wantCode(t, tc.ctx().Check(), tc.want)
			}
		})
	}
}

// A record that carries authority (approval, batch) can be stored with a
// broken context, so that the failure is recorded, but the context itself
// never passes Check.
func TestDecodedContextIsCheckedNotTrusted(t *testing.T) {
	m := toMap(t, readGolden(t, "approval_record.v2.msgpack"))
	delete(m["context"].(map[string]any)["requester"].(map[string]any), "principal")
	a, err := schemas.Decode[schemas.ApprovalRecord](fromMap(t, m))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	wantCode(t, a.Context.CheckFor(a.TurnID), schemas.CodeTurnContextInvalid)

	delete(m, "context")
	a, err = schemas.Decode[schemas.ApprovalRecord](fromMap(t, m))
	if err != nil {
		t.Fatalf("decode without context: %v", err)
	}
	if a.Context != nil {
		t.Fatalf("context %+v appeared from nowhere", a.Context)
	}
	wantCode(t, a.Context.CheckFor(a.TurnID), schemas.CodeTurnContextMissing)
}

func TestRecordValidation(t *testing.T) {
	cases := []struct {
		name string
		rec  schemas.Record
		want schemas.Code
	}{
		{"approval with an unknown status", func() schemas.Record { a := exampleApproval(); a.Status = "maybe"; return a }(), schemas.CodeInvalidInput},
		{"approval without a tool", func() schemas.Record { a := exampleApproval(); a.Tool = ""; return a }(), schemas.CodeInvalidInput},
		{"decided event still pending", func() schemas.Record { e := exampleDecided(); e.Status = schemas.ApprovalPending; return e }(), schemas.CodeInvalidInput},
		{"rejection without a code", func() schemas.Record { r := exampleRejected(); r.Code = ""; return r }(), schemas.CodeInvalidInput},
		{"redrive with an unknown kind", func() schemas.Record { o := exampleRedrive(); o.Kind = "retrying"; return o }(), schemas.CodeInvalidInput},
		{"turn outcome with a non-terminal state", func() schemas.Record { o := exampleOutcome(); o.State = "running"; return o }(), schemas.CodeInvalidInput},
		{"batch with fewer results than calls", func() schemas.Record { b := exampleBatch(); b.Results = b.Results[:1]; return b }(), schemas.CodeInvalidInput},
		{"batch with more approvals than calls", func() schemas.Record {
			b := exampleBatch()
			b.Approvals = append(b.Approvals, "a-x-2")
			return b
		}(), schemas.CodeInvalidInput},
		{"batch with an unknown state", func() schemas.Record { b := exampleBatch(); b.State = "paused"; return b }(), schemas.CodeInvalidInput},
		{"batch placed after a turn without its entry's sequence", func() schemas.Record { b := exampleBatchOrdered(); b.OrderSeq = 0; return b }(), schemas.CodeInvalidInput},
		{"batch placed after something that is not a turn id", func() schemas.Record { b := exampleBatchOrdered(); b.OrderAfter = "t 1.>"; return b }(), schemas.CodeInvalidInput},
		{"running batch with an outcome", func() schemas.Record { b := exampleBatch(); b.State = schemas.BatchRunning; return b }(), schemas.CodeInvalidInput},
		{"failed batch with a completed outcome", func() schemas.Record { b := exampleBatch(); b.Outcome.State = schemas.TurnCompleted; return b }(), schemas.CodeInvalidInput},
		{"completed batch with a failed outcome", func() schemas.Record { b := exampleBatch(); b.State = schemas.BatchCompleted; return b }(), schemas.CodeInvalidInput},
		{"batch with an outcome of another version", func() schemas.Record { b := exampleBatch(); b.Outcome.V = 9; return b }(), schemas.CodeSchemaVersionUnsupported},
		{"batch with another turn's outcome", func() schemas.Record { b := exampleBatch(); b.Outcome.TurnID = "t-other"; return b }(), schemas.CodeInvalidInput},
		{"batch with another session's outcome", func() schemas.Record { b := exampleBatch(); b.Outcome.SessionID = "s-other"; return b }(), schemas.CodeInvalidInput},
		{"version 1 batch with an outcome", func() schemas.Record {
			b := exampleBatchV1()
			b.Outcome = exampleOutcome()
			return b
		}(), schemas.CodeInvalidInput},
		{"batch outcome with too many results", func() schemas.Record {
			b := exampleBatch()
			b.Outcome.Results = make([]schemas.ToolResult, schemas.MaxCalls+1)
			return b
		}(), schemas.CodePayloadTooLarge},
		{"accepted turn with too many calls", func() schemas.Record {
			a := exampleAccepted()
			a.Calls = make([]schemas.ToolCall, schemas.MaxCalls+1)
			return a
		}(), schemas.CodePayloadTooLarge},
		{"accepted turn deeper than the follow-up limit", func() schemas.Record {
			a := exampleAccepted()
			a.FollowUpDepth = schemas.MaxFollowUpDepth + 1
			return a
		}(), schemas.CodeInvalidInput},
		{"accepted turn with a negative follow-up depth", func() schemas.Record { a := exampleAccepted(); a.FollowUpDepth = -1; return a }(), schemas.CodeInvalidInput},
		{"batch deeper than the follow-up limit", func() schemas.Record {
			b := exampleBatch()
			b.FollowUpDepth = schemas.MaxFollowUpDepth + 1
			return b
		}(), schemas.CodeInvalidInput},
		{"session without an id", func() schemas.Record { s := exampleSession(); s.SessionID = ""; return s }(), schemas.CodeInvalidInput},
		{"claim without a call id", func() schemas.Record { c := exampleClaim(); c.CallID = ""; return c }(), schemas.CodeInvalidInput},
		{"notice of an unknown kind", func() schemas.Record { n := exampleNotice(); n.Kind = "done"; return n }(), schemas.CodeInvalidInput},
		{"awaiting snapshot with fewer results than approvals", func() schemas.Record {
			n := exampleNotice()
			n.Approvals, n.Results = []string{"", "a-x-1"}, []*schemas.ToolResult{nil}
			return n
		}(), schemas.CodeInvalidInput},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := schemas.Encode(tc.rec)
			wantCode(t, err, tc.want)
			if b != nil {
				t.Errorf("got %d bytes with the error", len(b))
			}
		})
	}
}

func TestStatusPredicates(t *testing.T) {
	for s, decided := range map[schemas.ApprovalStatus]bool{
		schemas.ApprovalPending: false, schemas.ApprovalApproved: true, schemas.ApprovalDenied: true,
		schemas.ApprovalExpired: true, schemas.ApprovalAbandoned: true, "": false, "approved ": false,
	} {
		if got := s.Decided(); got != decided {
			t.Errorf("%q.Decided() = %v, want %v", s, got, decided)
		}
	}
	for s, terminal := range map[schemas.BatchState]bool{
		schemas.BatchQueued: false, schemas.BatchRunning: false, schemas.BatchAwaiting: false,
		schemas.BatchStarted: false, schemas.BatchCompleted: true, schemas.BatchFailed: true, "": false,
	} {
		if got := s.Terminal(); got != terminal {
			t.Errorf("%q.Terminal() = %v, want %v", s, got, terminal)
		}
	}
	a := exampleApproval()
	for opt, offered := range map[string]bool{"approve": true, "deny": true, "": false, "Approve": false, "approve_all": false} {
		if got := a.Offers(opt); got != offered {
			t.Errorf("Offers(%q) = %v, want %v", opt, got, offered)
		}
	}
}

func TestCheckToolName(t *testing.T) {
	cases := []struct {
		name string
		tool string
		ok   bool
	}{
		{"a plain name", "echo", true},
		{"dots, dashes, underscores and digits", "email.send_v2-beta", true},
		{"64 bytes", strings.Repeat("a", 64), true},
		{"empty", "", false},
		{"65 bytes", strings.Repeat("a", 65), false},
		{"a space", "Bad Tool", false},
		{"upper case", "Echo", false},
		{"a path", "echo/../x", false},
		{"a subject wildcard", "echo.>", false},
		{"non-ASCII", "écho", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := schemas.CheckToolName(tc.tool)
			if tc.ok {
				if err != nil {
					t.Fatalf("CheckToolName(%q): %v", tc.tool, err)
				}
				return
			}
			wantCode(t, err, schemas.CodeInvalidInput)
		})
	}
}

// Admits is the containment rule of decisions and deliveries: a channel
// may show a turn only if it reaches no more people than the turn's
// audience, and nothing is shown for an unknown audience or channel kind.
func TestAudienceAdmits(t *testing.T) {
	tests := []struct {
		audience schemas.Audience
		kind     schemas.ChannelKind
		want     bool
	}{
		{schemas.AudiencePersonal, schemas.ChannelDM, true},
		{schemas.AudiencePersonal, schemas.ChannelPrivate, false},
		{schemas.AudiencePersonal, schemas.ChannelPublic, false},
		{schemas.AudienceTeam, schemas.ChannelDM, true},
		{schemas.AudienceTeam, schemas.ChannelPrivate, true},
		{schemas.AudienceTeam, schemas.ChannelPublic, false},
		{schemas.AudiencePublic, schemas.ChannelPublic, true},
		{"", schemas.ChannelDM, false},
		{"everyone", schemas.ChannelDM, false},
		{schemas.AudiencePublic, "forum", false},
	}
	for _, tc := range tests {
		if got := tc.audience.Admits(tc.kind); got != tc.want {
			t.Errorf("audience %q admits a %q channel: %v, want %v", tc.audience, tc.kind, got, tc.want)
		}
	}
}

// The approvals a batch's move to awaiting requested are each bound to
// one of its calls, and are carried by that write only: anything else is
// refused both ways, so a forged or stale request never reaches a reader.
func TestRequestedApprovalsBindTheirBatch(t *testing.T) {
	tests := []struct {
		name   string
		change func(*schemas.BatchRecord)
		want   schemas.Code
	}{
		{"the awaiting write with its request", func(*schemas.BatchRecord) {}, ""},
		{"a running batch with a request", func(b *schemas.BatchRecord) { b.State = schemas.BatchRunning }, schemas.CodeInvalidInput},
		{"a started batch with a request", func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted }, schemas.CodeInvalidInput},
		{"a request for no call of the batch", func(b *schemas.BatchRecord) { b.Requested[0].CallID = "c-other" }, schemas.CodeInvalidInput},
		{"a request under another approval id", func(b *schemas.BatchRecord) {
			b.Requested[0].ApprovalID = schemas.ApprovalID(b.TurnID, 1)
		}, schemas.CodeInvalidInput},
		{"a request of another turn", func(b *schemas.BatchRecord) { b.Requested[0].TurnID = "t-other" }, schemas.CodeInvalidInput},
		{"a request of another session", func(b *schemas.BatchRecord) { b.Requested[0].SessionID = "s-other" }, schemas.CodeInvalidInput},
		{"a request for other arguments", func(b *schemas.BatchRecord) { b.Requested[0].ArgsDigest = strings.Repeat("0", 64) }, schemas.CodeInvalidInput},
		{"a request for another tool", func(b *schemas.BatchRecord) { b.Requested[0].Tool = "shell.run" }, schemas.CodeInvalidInput},
		{"a request that carries its own context", func(b *schemas.BatchRecord) { b.Requested[0].Context = b.Context }, schemas.CodeInvalidInput},
		{"a request that carries its own arguments", func(b *schemas.BatchRecord) { b.Requested[0].Args = b.Calls[0].Args }, schemas.CodeInvalidInput},
		{"a call requested twice", func(b *schemas.BatchRecord) { b.Requested = append(b.Requested, b.Requested[0]) }, schemas.CodeInvalidInput},
		{"an empty request", func(b *schemas.BatchRecord) { b.Requested[0] = nil }, schemas.CodeInvalidInput},
		{"a request of an unknown version", func(b *schemas.BatchRecord) { b.Requested[0].V = 9 }, schemas.CodeSchemaVersionUnsupported},
		{"a request with an unknown status", func(b *schemas.BatchRecord) { b.Requested[0].Status = "maybe" }, schemas.CodeInvalidInput},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := exampleBatchAwaiting()
			tc.change(b)
			checkBothWays(t, b, tc.want)
		})
	}
	t.Run("a version 1 batch with a request", func(t *testing.T) {
		b := exampleBatchAwaiting()
		b.V, b.Claims = 1, nil
		checkBothWays(t, (*schemas.BatchRecordV1)(b), schemas.CodeInvalidInput)
	})
}

// RequestedApprovals gives back, byte for byte, the record the
// approval-requested event announced: the summary-only record with the
// batch's context and arguments.
func TestRequestedApprovalsAreTheAnnouncedRecords(t *testing.T) {
	data, err := schemas.Encode(exampleBatchAwaiting())
	if err != nil {
		t.Fatal(err)
	}
	b, err := schemas.DecodeBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	got := b.RequestedApprovals()
	if len(got) != 1 {
		t.Fatalf("%d requested approvals, want 1", len(got))
	}
	gotBytes, err := schemas.Encode(got[0])
	if err != nil {
		t.Fatal(err)
	}
	want, err := schemas.Encode(exampleApprovalPreview().SummaryOnly())
	if err != nil {
		t.Fatal(err)
	}
	if string(gotBytes) != string(want) {
		t.Errorf("requested approval encodes to\n%x\nwant the announced record\n%x", gotBytes, want)
	}
	if (&schemas.BatchRecord{}).RequestedApprovals() != nil {
		t.Error("a batch without requests gives some")
	}
}

// TestAMemberErrorNamesItsField: an error in a sender's or a channel's
// member names the member under its field (the name is built only for a
// failure).
func TestAMemberErrorNamesItsField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*schemas.InboundMessage)
		want   string
	}{
		{"missing sender id", func(m *schemas.InboundMessage) { m.Sender.ID = "" }, "sender.id is required"},
		{"sender display over its limit", func(m *schemas.InboundMessage) { m.Sender.Display = strings.Repeat("d", 129) }, "sender.display is 129 bytes"},
		{"missing channel id", func(m *schemas.InboundMessage) { m.Channel.ID = "" }, "channel.id is required"},
		{"channel thread with a control character", func(m *schemas.InboundMessage) { m.Channel.Thread = "t\x07" }, "channel.thread"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := exampleInbound()
			tc.mutate(m)
			_, err := schemas.Encode(m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}
