package schemas_test

import (
	"bytes"
	"reflect"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Fixed, fully populated examples of every record type. The golden files in
// testdata/ are their encodings; change an example only together with its
// golden file (go test ./schemas -run TestGolden -update).

var (
	t0 = time.Date(2026, 3, 14, 9, 26, 53, 589793238, time.UTC)
	t1 = t0.Add(1500 * time.Millisecond)
	t2 = t0.Add(2 * time.Minute)
	t3 = t0.Add(72 * time.Hour)
)

const (
	exTransport = "slack"
	exMessageID = "1710408413.000100"
	exSession   = "T024BE7LD/C0123ABC/1710408400.000050"
	exArgs      = `{"body":"Quarterly numbers attached.","to":["cfo@example.com"]}`
	exArgs2     = `{"path":"/reports/q1.pdf"}`
)

var (
	exTurnID   = schemas.TurnID(exTransport, exMessageID)
	exDigest   = schemas.ArgsDigest(exArgs)
	exDigest2  = schemas.ArgsDigest(exArgs2)
	exApproval = schemas.ApprovalID(exTurnID, 0)
	exGrant    = schemas.GrantID(exApproval, "d-01HV8Z6Q3K")
)

func exampleChannel() schemas.Channel {
	return schemas.Channel{ID: "C0123ABC", Kind: schemas.ChannelPrivate, Thread: "1710408400.000050"}
}

func exampleContext() *schemas.TurnContext {
	return &schemas.TurnContext{
		V:          1,
		SessionID:  exSession,
		SessionKey: schemas.SessionKey(exTransport, exSession),
		TurnID:     exTurnID,
		Requester: schemas.Requester{
			Principal: schemas.Principal(exTransport, "U02ABCDEF"),
			SenderID:  "U02ABCDEF",
			Display:   "Ada Lovelace",
			Kind:      schemas.SenderUser,
			Verified:  true,
		},
		Transport:     exTransport,
		Channel:       exampleChannel(),
		Audience:      schemas.AudienceTeam,
		TrustBoundary: "acme-corp",
		Interactive:   true,
		Provenance: schemas.Provenance{
			Transport:  exTransport,
			MessageID:  exMessageID,
			StreamSeq:  4242,
			ReceivedAt: t0,
			IngestedBy: "ingest-7f9c",
		},
		CreatedAt:      t1,
		LegacyRestored: true,
		Seal:           &schemas.Seal{KeyID: "k1", MAC: bytes.Repeat([]byte{0xA5}, 32)},
	}
}

func exampleInbound() *schemas.InboundMessage {
	return &schemas.InboundMessage{
		V:         1,
		Transport: exTransport,
		MessageID: exMessageID,
		SessionID: exSession,
		Sender:    schemas.Sender{ID: "U02ABCDEF", Display: "Ada Lovelace", Kind: schemas.SenderUser, Verified: true, Strong: true},
		Channel:   exampleChannel(),
		Text:      "Send the Q1 report to the CFO.\nThanks!",
		Calls: []schemas.ProposedCall{
			{Tool: "email.send", Args: exArgs},
			{Tool: "files.read", Args: exArgs2},
		},
		SentAt: t0,
	}
}

func exampleToolCalls() []schemas.ToolCall {
	return []schemas.ToolCall{
		{CallID: schemas.CallID(exTurnID, 0), Index: 0, Tool: "email.send", Args: exArgs, ArgsDigest: exDigest},
		{CallID: schemas.CallID(exTurnID, 1), Index: 1, Tool: "files.read", Args: exArgs2, ArgsDigest: exDigest2},
	}
}

func exampleAccepted() *schemas.AcceptedTurn {
	return &schemas.AcceptedTurn{
		V:             1,
		TurnID:        exTurnID,
		Context:       exampleContext(),
		Text:          "Send the Q1 report to the CFO.\nThanks!",
		Calls:         exampleToolCalls(),
		AcceptedAt:    t1,
		Origin:        "t-0f1e2d3c4b5a69788796-0",
		NotBefore:     t2,
		FollowUpDepth: 1,
	}
}

func exampleDecision() *schemas.Decision {
	ch := exampleChannel()
	return &schemas.Decision{
		V:          1,
		DecisionID: "d-01HV8Z6Q3K",
		ApprovalID: exApproval,
		Transport:  exTransport,
		Decider:    schemas.Sender{ID: "U09MANAGER", Display: "Grace Hopper", Kind: schemas.SenderUser, Verified: true, Strong: true},
		Channel:    &ch,
		Option:     schemas.OptionApprove,
		ArgsDigest: exDigest,
		Note:       "Fine to send.\nCC me next time.",
		SentAt:     t2,
	}
}

func exampleDecisionInfo() *schemas.DecisionInfo {
	return &schemas.DecisionInfo{
		DecisionID: "d-01HV8Z6Q3K",
		Principal:  schemas.Principal(exTransport, "U09MANAGER"),
		Option:     schemas.OptionApprove,
		DecidedAt:  t2,
		Assurance:  schemas.AssuranceStrong,
		Grant:      exampleGrantUse(),
		Note:       "Fine to send.\nCC me next time.",
	}
}

// legacyDecisionInfo is the decision of a version 1 record, which
// predates grants and notes kept with the decision.
func legacyDecisionInfo() *schemas.DecisionInfo {
	d := exampleDecisionInfo()
	d.Grant, d.Note = nil, ""
	return d
}

func exampleApproval() *schemas.ApprovalRecord {
	return &schemas.ApprovalRecord{
		V:             2,
		ApprovalID:    exApproval,
		TurnID:        exTurnID,
		SessionID:     exSession,
		CallID:        schemas.CallID(exTurnID, 0),
		Context:       exampleContext(),
		Tool:          "email.send",
		Args:          exArgs,
		ArgsDigest:    exDigest,
		PolicyVersion: "policy-2026-03-01.3",
		Options:       []string{schemas.OptionApprove, schemas.OptionDeny},
		Status:        schemas.ApprovalApproved,
		RequestedAt:   t1,
		ExpiresAt:     t3,
		Decision:      exampleDecisionInfo(),
		Quorum:        2,
		Votes:         []schemas.DecisionInfo{*exampleDecisionInfo(), *exampleDecisionInfo()},
		Trace:         map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=value"},
		Grants:        []schemas.GrantOffer{exampleGrantOffer()},
	}
}

// exampleApprovalPreview is exampleApproval with a preview (the v2 golden
// file without one pins the bytes of records written before previews).
func exampleApprovalPreview() *schemas.ApprovalRecord {
	a := exampleApproval()
	a.Preview = &schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: "diff",
		Text: "--- notes.txt\n+++ notes.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n", Reason: "text cut to 16384 bytes", Truncated: true, At: t1}
	return a
}

func exampleGrantScope() schemas.GrantScope {
	return schemas.GrantScope{Kind: schemas.GrantScopeSession, SessionID: exSession,
		PathField: "attachment", PathPrefix: "reports/", ValueField: "to", Values: []string{"cfo@example.com"}}
}

func exampleGrantOffer() schemas.GrantOffer {
	return schemas.GrantOffer{
		Option: "approve-session-recipients", Effect: schemas.ApprovalApproved, Tool: "email.send",
		Scope: exampleGrantScope(), For: 8 * time.Hour,
		Summary: "approve email.send for slack:U02ABCDEF in this session where attachment is under reports/ and to is cfo@example.com, for 8h",
	}
}

func exampleGrantUse() *schemas.GrantUse {
	return &schemas.GrantUse{GrantID: exGrant, Scope: exampleGrantScope(), Summary: exampleGrantOffer().Summary}
}

func exampleGrant() *schemas.Grant {
	return &schemas.Grant{
		V: 1, GrantID: exGrant, Option: "approve-session-recipients", Effect: schemas.ApprovalApproved,
		Tool: "email.send", Scope: exampleGrantScope(), Summary: exampleGrantOffer().Summary,
		Principal: schemas.Principal(exTransport, "U09MANAGER"), Assurance: schemas.AssuranceVerified,
		Context: exampleContext(), ApprovalID: exApproval, DecisionID: "d-01HV8Z6Q3K",
		PolicyVersion: "policy-2026-03-01.3", CreatedAt: t2, ExpiresAt: t3,
		MAC:     &schemas.Seal{KeyID: "k1", MAC: bytes.Repeat([]byte{0x5A}, 32)},
		Revoked: &schemas.GrantRevocation{By: "admin", At: t3, Reason: "no longer needed"},
	}
}

func exampleGrantIndex() *schemas.GrantIndex {
	return &schemas.GrantIndex{V: 1, Tool: "email.send", Principal: schemas.Principal(exTransport, "U02ABCDEF"),
		Grants: []string{exGrant}, UpdatedAt: t2}
}

func exampleGrantEvent() *schemas.GrantEvent {
	return &schemas.GrantEvent{
		V: 1, Kind: schemas.GrantRevoked, GrantID: exGrant, Tool: "email.send", Grant: exampleGrant(),
		ApprovalID: exApproval, TurnID: exTurnID, CallID: schemas.CallID(exTurnID, 0), Status: schemas.ApprovalApproved,
		By: "admin", Reason: "no longer needed", At: t3,
	}
}

// exampleApprovalV1 is the legacy shape: copied authority fields instead of
// a TurnContext (read only through pipeline/legacy).
func exampleApprovalV1() *schemas.ApprovalRecordV1 {
	ch := exampleChannel()
	return &schemas.ApprovalRecordV1{
		V:             1,
		ApprovalID:    exApproval,
		TurnID:        exTurnID,
		SessionID:     exSession,
		CallID:        schemas.CallID(exTurnID, 0),
		Tool:          "email.send",
		Args:          exArgs,
		ArgsDigest:    exDigest,
		PolicyVersion: "policy-2025-11-01.1",
		Options:       []string{schemas.OptionApprove, schemas.OptionDeny},
		Status:        schemas.ApprovalPending,
		RequestedAt:   t1,
		ExpiresAt:     t3,
		Decision:      legacyDecisionInfo(),
		Transport:     exTransport,
		Sender:        &schemas.Sender{ID: "U02ABCDEF", Display: "Ada Lovelace", Kind: schemas.SenderUser, Verified: true, Strong: true},
		Channel:       &ch,
		Audience:      schemas.AudienceTeam,
		TrustBoundary: "acme-corp",
	}
}

func exampleDecided() *schemas.DecidedEvent {
	return &schemas.DecidedEvent{
		V:          1,
		ApprovalID: exApproval,
		TurnID:     exTurnID,
		SessionID:  exSession,
		Status:     schemas.ApprovalApproved,
		Decision:   exampleDecisionInfo(),
		At:         t2,
		Votes:      []schemas.DecisionInfo{*exampleDecisionInfo()},
		Repeat:     "d-9c1e2f3a4b5c6d7e8f901234", // announced again for a repeat of the outcome
	}
}

func exampleVoted() *schemas.VotedEvent {
	return &schemas.VotedEvent{
		V:          1,
		ApprovalID: exApproval,
		TurnID:     exTurnID,
		SessionID:  exSession,
		Vote:       *exampleDecisionInfo(),
		Votes:      []schemas.DecisionInfo{*exampleDecisionInfo()},
		Quorum:     2,
		At:         t2,
	}
}

func exampleRejected() *schemas.DecisionRejected {
	return &schemas.DecisionRejected{
		V:          1,
		DecisionID: "d-01HV8Z7AAA",
		ApprovalID: exApproval,
		Principal:  schemas.Principal(exTransport, "U0INTRUDER"),
		Code:       schemas.CodeDeciderNotAuthorized,
		Reason:     "slack:U0INTRUDER may not decide approvals of this turn",
		At:         t2,
	}
}

func exampleRedrive() *schemas.RedriveOutcome {
	return &schemas.RedriveOutcome{
		V:       1,
		TurnID:  exTurnID,
		Kind:    schemas.RedriveFailed,
		Code:    schemas.CodeTurnContextInvalid,
		Reason:  "requester.principal is required",
		Pending: 1,
		Trigger: "decided",
		At:      t2,
	}
}

func exampleResult(i int) schemas.ToolResult {
	if i == 0 {
		return schemas.ToolResult{
			CallID:     schemas.CallID(exTurnID, 0),
			Tool:       "email.send",
			Status:     schemas.ResultOK,
			Output:     `{"message_id":"<abc@example.com>"}`,
			ApprovalID: exApproval,
			FinishedAt: t2,
		}
	}
	return schemas.ToolResult{
		CallID:     schemas.CallID(exTurnID, 1),
		Tool:       "files.read",
		Status:     schemas.ResultFailed,
		Output:     "no output: the tool did not run",
		Code:       schemas.CodeToolNotFound,
		Reason:     "files.read is not registered",
		ApprovalID: schemas.ApprovalID(exTurnID, 1),
		FinishedAt: t2,
	}
}

func exampleOutcome() *schemas.TurnOutcome {
	return &schemas.TurnOutcome{
		V:          1,
		TurnID:     exTurnID,
		SessionID:  exSession,
		State:      schemas.TurnFailed,
		Code:       schemas.CodeToolNotFound,
		Reason:     "one call failed",
		Results:    []schemas.ToolResult{exampleResult(0), exampleResult(1)},
		Reply:      schemas.ReplyTarget{Transport: exTransport, Channel: exampleChannel()},
		Audience:   schemas.AudienceTeam,
		FinishedAt: t3,
	}
}

func exampleBatch() *schemas.BatchRecord {
	r0, r1 := exampleResult(0), exampleResult(1)
	return &schemas.BatchRecord{
		V:             2,
		TurnID:        exTurnID,
		SessionID:     exSession,
		Context:       exampleContext(),
		Text:          "Send the Q1 report to the CFO.\nThanks!",
		Calls:         exampleToolCalls(),
		State:         schemas.BatchFailed,
		Approvals:     []string{exApproval, schemas.ApprovalID(exTurnID, 1)},
		Results:       []*schemas.ToolResult{&r0, &r1},
		Code:          schemas.CodeToolNotFound,
		Reason:        "one call failed",
		CreatedAt:     t1,
		UpdatedAt:     t3,
		Origin:        "t-0f1e2d3c4b5a69788796-0",
		FollowUpDepth: 1,
		// Plan, HeldBy and SupersededBy never all hold at once; the golden
		// vector carries every key.
		Plan:         true,
		HeldBy:       "t-0f1e2d3c4b5a69788796",
		SupersededBy: "t-1a2b3c4d5e6f70819203",
		Claims: []*schemas.CallClaim{
			{Worker: "executor@host:4242-9f86d081", ClaimedAt: t2},
			{Worker: "redriver@host:4243-0c1d2e3f", ClaimedAt: t3},
		},
		Outcome: exampleOutcome(),
	}
}

// exampleBatchAwaiting is exampleBatch as its move to awaiting wrote it:
// no outcome yet, and the approval it requested (Requested).
func exampleBatchAwaiting() *schemas.BatchRecord {
	b := exampleBatch()
	b.State, b.Code, b.Reason, b.Outcome = schemas.BatchAwaiting, "", "", nil
	b.Results[0] = nil
	b.Requested = []*schemas.ApprovalRecord{exampleApprovalPreview().AsRequested()}
	return b
}

// exampleBatchStarted is a batch as it moves to started: the decision its
// barrier passed on kept with it, its approved call claimed.
func exampleBatchStarted() *schemas.BatchRecord {
	b := exampleBatch()
	b.State, b.Code, b.Reason, b.Outcome = schemas.BatchStarted, "", "", nil
	b.Results[0] = nil
	d := exampleDecided()
	d.Repeat = ""
	b.Decided = []*schemas.DecidedEvent{d}
	return b
}

// exampleBatchOrdered is a batch whose turn came as an entry of its
// session's order, queued behind the entry before it.
func exampleBatchOrdered() *schemas.BatchRecord {
	b := exampleBatch()
	b.State, b.Code, b.Reason, b.Outcome, b.Claims = schemas.BatchQueued, "", "", nil, nil
	b.Results = make([]*schemas.ToolResult, len(b.Calls))
	b.Approvals = make([]string, len(b.Calls))
	b.OrderSeq, b.OrderAfter = 7301, schemas.TurnID(exTransport, "m0")
	return b
}

// examplePlannerTurn is a planner turn superseded at its second step,
// placed in its session's order.
func examplePlannerTurn() *schemas.PlannerTurn {
	return &schemas.PlannerTurn{
		V: 1, TurnID: exTurnID, SessionID: exSession, Context: exampleContext(), Text: "summarise the quarter and mail it",
		State: schemas.PlannerFailed, Step: 1, TokensIn: 1200, TokensOut: 340,
		Code: schemas.CodeTurnSuperseded, Reason: "superseded by a newer turn of the session",
		SupersededBy: schemas.TurnID(exTransport, "m2"), Reply: "The summary so far: revenue up 4%.",
		StartedAt: t1, UpdatedAt: t1,
		OrderSeq: 7301, OrderAfter: schemas.TurnID(exTransport, "m0"),
	}
}

// exampleBatchV1 is exampleBatch as version 1 wrote it: no claims (they
// were records of tollgate_claims) and no outcome (it was only published).
func exampleBatchV1() *schemas.BatchRecordV1 {
	b := exampleBatch()
	b.V, b.Claims, b.Outcome = 1, nil, nil
	return (*schemas.BatchRecordV1)(b)
}

func exampleSession() *schemas.SessionRecord {
	return &schemas.SessionRecord{
		V:          1,
		SessionID:  exSession,
		Active:     exTurnID,
		Queue:      []string{schemas.TurnID(exTransport, "m2"), schemas.TurnID(exTransport, "m3")},
		UpdatedAt:  t1,
		InboundSeq: 41,
	}
}

func exampleClaim() *schemas.ExecutionClaim {
	r := exampleResult(1)
	return &schemas.ExecutionClaim{
		V:          1,
		CallID:     schemas.CallID(exTurnID, 1),
		TurnID:     exTurnID,
		Tool:       "files.read",
		ArgsDigest: exDigest2,
		Worker:     "executor-2b1e",
		ClaimedAt:  t1,
		Result:     &r,
	}
}

func exampleNotice() *schemas.TurnNotice {
	r0, r1 := exampleResult(0), exampleResult(1)
	return &schemas.TurnNotice{
		V:         1,
		TurnID:    exTurnID,
		SessionID: exSession,
		Kind:      schemas.NoticeAwaiting,
		At:        t1,
		Approvals: []string{exApproval, schemas.ApprovalID(exTurnID, 1)},
		Results:   []*schemas.ToolResult{&r0, &r1},
	}
}

// recordType is one record type: its golden file name, a fresh example and
// its decoder.
type recordType struct {
	golden  string // file in testdata/, named <type>.v<version>.msgpack
	version int
	example func() schemas.Record
	decode  func([]byte) (schemas.Record, error)
}

func decodeAs[T any, P schemas.Ptr[T]](b []byte) (schemas.Record, error) {
	v, err := schemas.Decode[T, P](b)
	if err != nil {
		return nil, err
	}
	return P(v), nil
}

var recordTypes = []recordType{
	{"inbound_message.v1.msgpack", 1, func() schemas.Record { return exampleInbound() }, decodeAs[schemas.InboundMessage]},
	{"turn_context.v1.msgpack", 1, func() schemas.Record { return exampleContext() }, decodeAs[schemas.TurnContext]},
	{"accepted_turn.v1.msgpack", 1, func() schemas.Record { return exampleAccepted() }, decodeAs[schemas.AcceptedTurn]},
	{"decision.v1.msgpack", 1, func() schemas.Record { return exampleDecision() }, decodeAs[schemas.Decision]},
	{"approval_record.v2.msgpack", 2, func() schemas.Record { return exampleApproval() }, decodeAs[schemas.ApprovalRecord]},
	{"approval_record.v2-preview.msgpack", 2, func() schemas.Record { return exampleApprovalPreview() }, decodeAs[schemas.ApprovalRecord]},
	{"approval_record.v2-preview-summary.msgpack", 2, func() schemas.Record { return exampleApprovalPreview().SummaryOnly() }, decodeAs[schemas.ApprovalRecord]},
	{"approval_record.v1.msgpack", 1, func() schemas.Record { return exampleApprovalV1() }, decodeAs[schemas.ApprovalRecordV1]},
	{"decided_event.v1.msgpack", 1, func() schemas.Record { return exampleDecided() }, decodeAs[schemas.DecidedEvent]},
	{"voted_event.v1.msgpack", 1, func() schemas.Record { return exampleVoted() }, decodeAs[schemas.VotedEvent]},
	{"decision_rejected.v1.msgpack", 1, func() schemas.Record { return exampleRejected() }, decodeAs[schemas.DecisionRejected]},
	{"redrive_outcome.v1.msgpack", 1, func() schemas.Record { return exampleRedrive() }, decodeAs[schemas.RedriveOutcome]},
	{"turn_outcome.v1.msgpack", 1, func() schemas.Record { return exampleOutcome() }, decodeAs[schemas.TurnOutcome]},
	{"batch_record.v2.msgpack", 2, func() schemas.Record { return exampleBatch() }, decodeAs[schemas.BatchRecord]},
	{"batch_record.v1.msgpack", 1, func() schemas.Record { return exampleBatchV1() }, decodeAs[schemas.BatchRecordV1]},
	{"batch_record.v2-awaiting.msgpack", 2, func() schemas.Record { return exampleBatchAwaiting() }, decodeAs[schemas.BatchRecord]},
	{"batch_record.v2-ordered.msgpack", 2, func() schemas.Record { return exampleBatchOrdered() }, decodeAs[schemas.BatchRecord]},
	{"batch_record.v2-started.msgpack", 2, func() schemas.Record { return exampleBatchStarted() }, decodeAs[schemas.BatchRecord]},
	{"planner_turn.v1.msgpack", 1, func() schemas.Record { return examplePlannerTurn() }, decodeAs[schemas.PlannerTurn]},
	{"session_record.v1.msgpack", 1, func() schemas.Record { return exampleSession() }, decodeAs[schemas.SessionRecord]},
	{"execution_claim.v1.msgpack", 1, func() schemas.Record { return exampleClaim() }, decodeAs[schemas.ExecutionClaim]},
	{"turn_notice.v1.msgpack", 1, func() schemas.Record { return exampleNotice() }, decodeAs[schemas.TurnNotice]},
	{"grant.v1.msgpack", 1, func() schemas.Record { return exampleGrant() }, decodeAs[schemas.Grant]},
	{"grant_index.v1.msgpack", 1, func() schemas.Record { return exampleGrantIndex() }, decodeAs[schemas.GrantIndex]},
	{"grant_event.v1.msgpack", 1, func() schemas.Record { return exampleGrantEvent() }, decodeAs[schemas.GrantEvent]},
}

// utc returns v with every time.Time reachable from it (through pointers,
// structs and slices) converted to UTC. The msgpack decoder returns times in
// time.Local; the instant is what the encoding carries.
func utc[V any](v V) V {
	utcValue(reflect.ValueOf(&v).Elem())
	return v
}

var timeType = reflect.TypeOf(time.Time{})

func utcValue(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			utcValue(v.Elem())
		}
	case reflect.Interface:
		if v.IsNil() {
			return
		}
		if tm, ok := v.Interface().(time.Time); ok && v.CanSet() {
			v.Set(reflect.ValueOf(tm.UTC()))
			return
		}
		utcValue(v.Elem())
	case reflect.Struct:
		if v.Type() == timeType {
			if v.CanSet() {
				v.Set(reflect.ValueOf(v.Interface().(time.Time).UTC()))
			}
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				utcValue(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len(); i++ {
			utcValue(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			utcValue(e)
			v.SetMapIndex(k, e)
		}
	}
}
