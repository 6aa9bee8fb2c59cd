package executor_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// testPolicy is the default policy plus the counting test tools.
const testPolicy = `{
  "version": "test-1",
  "default_approval": "required",
  "tools": {
    "echo":       {"approval": "never"},
    "write_file": {"approval": "required", "audiences": {"public": "deny"}, "expires_after": "24h"},
    "count":      {"approval": "required"},
    "free":       {"approval": "never"},
    "forbidden":  {"approval": "deny"}
  },
  "transports": {
    "cli":     {"trust_boundary": "local", "interactive": true},
    "webhook": {"trust_boundary": "external", "interactive": false}
  }
}`

func TestFastPathCompletesAtOnceAndRepliesUnderTheTurnContext(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	tests := []struct {
		name     string
		channel  schemas.Channel
		audience schemas.Audience
	}{
		{"a DM replies to the DM with a personal audience", schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}, schemas.AudiencePersonal},
		{"a private thread replies to that thread with a team audience", schemas.Channel{ID: "C-team", Kind: schemas.ChannelPrivate, Thread: "th-1"}, schemas.AudienceTeam},
		{"a public channel replies there with a public audience", schemas.Channel{ID: "C-pub", Kind: schemas.ChannelPublic}, schemas.AudiencePublic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			m := h.Inbound("fast-"+tc.channel.ID, "alice", pt.Call("echo", `{"text":"hi there"}`))
			m.Channel = tc.channel
			turn := h.Send(m)

			b, out := h.WaitTerminal(turn)
			if b.State != schemas.BatchCompleted {
				t.Fatalf("batch state %s (%s %s), want completed", b.State, b.Code, b.Reason)
			}
			if r := b.Results[0]; r == nil || r.Status != schemas.ResultOK || r.Output != "hi there" {
				t.Fatalf("echo result %+v, want ok with output %q", r, "hi there")
			}
			want := schemas.ReplyTarget{Transport: "cli", Channel: tc.channel}
			if out.State != schemas.TurnCompleted || out.Reply != want || out.Audience != tc.audience {
				t.Fatalf("outcome state %s reply %+v audience %s, want completed %+v %s", out.State, out.Reply, out.Audience, want, tc.audience)
			}
			if len(out.Results) != 1 || out.Results[0].Output != "hi there" {
				t.Fatalf("outcome results %+v", out.Results)
			}
			h.WaitIdle(pt.Executor, pt.Redriver)
			if n := len(h.Outcomes(turn)); n != 1 {
				t.Fatalf("%d outcome events, want exactly 1", n)
			}
			if n := len(h.Requested(turn)); n != 0 {
				t.Fatalf("%d approval-requested events for a turn needing no approval", n)
			}
			if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
				t.Fatalf("approval record %+v for a turn needing no approval", a)
			}
		})
	}
}

func TestApprovalPathWritesAPendingRecordBoundToTheCall(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	const rawArgs = `{ "path": "out/a.txt",   "content": "hello" }`
	const canonical = `{"content":"hello","path":"out/a.txt"}`

	for _, tc := range []struct {
		name       string
		option     string
		wantFile   bool
		wantStatus schemas.ResultStatus
		wantCode   schemas.Code
	}{
		{"approve writes the file once and completes", schemas.OptionApprove, true, schemas.ResultOK, ""},
		{"deny writes nothing and records the denial", schemas.OptionDeny, false, schemas.ResultDenied, schemas.CodeApprovalDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			m := h.Inbound("approve-"+tc.option, "alice", pt.Call("write_file", rawArgs))
			turn := h.Send(m)
			id := schemas.ApprovalID(turn, 0)
			a := h.WaitPending(id)
			b := h.Batch(turn)

			if a.Status != schemas.ApprovalPending || a.TurnID != turn || a.SessionID != m.SessionID || a.CallID != schemas.CallID(turn, 0) {
				t.Fatalf("record ids/status: %+v", a)
			}
			if !reflect.DeepEqual(a.Context, b.Context) || a.Context.Requester.Principal != "cli:alice" || a.Context.TurnID != turn {
				t.Fatalf("record context %+v, want the batch's %+v", a.Context, b.Context)
			}
			if a.Tool != "write_file" || a.Args != canonical || a.ArgsDigest != schemas.ArgsDigest(canonical) {
				t.Fatalf("record binds %s %s %s, want write_file %s %s", a.Tool, a.Args, a.ArgsDigest, canonical, schemas.ArgsDigest(canonical))
			}
			if !slices.Equal(a.Options, []string{"approve", "deny"}) || a.PolicyVersion != "builtin-1" {
				t.Fatalf("options %v policy %q", a.Options, a.PolicyVersion)
			}
			if got := a.ExpiresAt.Sub(a.RequestedAt); got != 24*time.Hour {
				t.Fatalf("expires %v after request, want 24h", got)
			}
			reqs := h.WaitRequested(turn, 1)
			if len(reqs) != 1 || reqs[0].ApprovalID != id || reqs[0].ArgsDigest != a.ArgsDigest {
				t.Fatalf("approval-requested events %+v, want one for %s", reqs, id)
			}
			if _, ok := h.File("out/a.txt"); ok {
				t.Fatal("file written before any decision")
			}
			// The batch's move to awaiting is its turn's log's event, with
			// its approvals and results; no awaiting notice is published.
			w := h.WaitState(turn, schemas.BatchAwaiting)
			if !slices.Equal(w.Approvals, []string{id}) || w.Results[0] != nil {
				t.Fatalf("awaiting batch approvals %v results %v, want [%s] and no result", w.Approvals, w.Results, id)
			}
			if ns := h.Events(topology.EventSubject(topology.SubjectBatchAwaiting, turn)); len(ns) != 0 {
				t.Fatalf("%d awaiting notices published, want none", len(ns))
			}
			// That event keeps the request, the record as announced (the
			// stored one, its preview summary-only); the batch as read
			// carries it no more, so no later write repeats it.
			if a.Preview == nil {
				t.Fatal("the pending record has no preview")
			}
			if logged := h.LoggedRequests(turn); len(logged) != 1 || !bytes.Equal(encoded(t, logged[0]), encoded(t, a.SummaryOnly())) {
				t.Fatalf("the awaiting event requests %+v, want the approval record as stored, its preview summary-only", logged)
			}
			if w.Requested != nil {
				t.Fatalf("the batch as read carries the requests %+v", w.Requested)
			}
			// That event is the request: nothing else is written for it.
			if n := len(h.PublishedRequests(turn)); n != 0 {
				t.Fatalf("%d approval.requested events published, want none: the awaiting event keeps the request", n)
			}

			h.Decide(id, tc.option, "alice")
			b, out := h.WaitTerminal(turn)
			if b.State != schemas.BatchCompleted || out.State != schemas.TurnCompleted {
				t.Fatalf("batch %s outcome %s, want completed", b.State, out.State)
			}
			r := b.Results[0]
			if r.Status != tc.wantStatus || r.Code != tc.wantCode || r.ApprovalID != id {
				t.Fatalf("result %+v, want %s %s for %s", r, tc.wantStatus, tc.wantCode, id)
			}
			if got := h.LoggedRequests(turn); len(got) != 1 {
				t.Fatalf("%d requests in the log after the decision, want the awaiting event's one", len(got))
			}
			content, ok := h.File("out/a.txt")
			if ok != tc.wantFile || (ok && content != "hello") {
				t.Fatalf("file exists=%v content=%q, want exists=%v", ok, content, tc.wantFile)
			}
			// The call that ran was claimed in the batch record, by the
			// write that started the batch; no claim record is written.
			if c := b.ClaimOf(0); (c != nil) != tc.wantFile || c != nil && (c.Worker == "" || c.ClaimedAt.After(r.FinishedAt)) {
				t.Fatalf("claim %+v, want one (before the result at %s) exactly when the tool ran (%v)", c, r.FinishedAt, tc.wantFile)
			}
			ctx, cancel := h.Ctx()
			defer cancel()
			if _, _, err := h.Store.Claims.Get(ctx, schemas.CallID(turn, 0)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("claim record: %v, want none (the claim is in the batch record)", err)
			}
			// Clean the sandbox for the next subtest.
			h.RemoveFile("out/a.txt")
		})
	}
}

func TestApprovedToolRunsOnceUnderTheRequestersContext(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: `{
	  "version": "named-approver",
	  "approvers": ["cli:bob"],
	  "tools": {"count": {"approval": "required"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`, Tools: []tools.Tool{count}})
	m := h.Inbound("rule1", "alice", pt.Call("count", `{"n":1}`))
	turn := h.Send(m)
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)

	// Bob, a named approver, decides; the tool must still run as alice.
	h.Decide(id, schemas.OptionApprove, "bob")
	b, _ := h.WaitTerminal(turn)
	if b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("result %+v", b.Results[0])
	}
	calls := count.Calls()
	if len(calls) != 1 {
		t.Fatalf("tool ran %d times, want 1", len(calls))
	}
	tc := calls[0].Context
	if tc.Requester.Principal != "cli:alice" || tc.TurnID != turn || !reflect.DeepEqual(tc, b.Context) {
		t.Fatalf("tool ran under %+v, want the turn's persisted context (requester cli:alice)", tc)
	}
	if a := h.Approval(id); a.Decision == nil || a.Decision.Principal != "cli:bob" {
		t.Fatalf("decision %+v, want recorded as decided by cli:bob", a.Decision)
	}
}

func TestPolicyDenialsNeverRunAndNeverPrompt(t *testing.T) {
	forbidden := &pt.Counter{ToolName: "forbidden"}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{forbidden}})
	tests := []struct {
		name    string
		call    schemas.ProposedCall
		channel schemas.ChannelKind
	}{
		{"a tool whose policy is deny", pt.Call("forbidden", `{}`), schemas.ChannelDM},
		{"write_file in a public channel is denied for the public audience", pt.Call("write_file", `{"path":"pub.txt","content":"x"}`), schemas.ChannelPublic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			m := h.Inbound("deny-"+string(tc.channel)+tc.call.Tool, "alice", tc.call)
			m.Channel.Kind = tc.channel
			turn := h.Send(m)
			b, out := h.WaitTerminal(turn)
			r := b.Results[0]
			if b.State != schemas.BatchCompleted || r.Status != schemas.ResultDenied || r.Code != schemas.CodePolicyDenied {
				t.Fatalf("batch %s result %+v, want completed with denied POLICY_DENIED", b.State, r)
			}
			if out.Results[0].Code != schemas.CodePolicyDenied {
				t.Fatalf("outcome result %+v", out.Results[0])
			}
			if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
				t.Fatalf("approval record created for a denied call: %+v", a)
			}
			if n := len(h.Requested(turn)); n != 0 {
				t.Fatalf("%d approval-requested events for a denied call", n)
			}
			if forbidden.Total() != 0 {
				t.Fatal("denied tool ran")
			}
			if files := h.SandboxFiles(); len(files) != 0 {
				t.Fatalf("sandbox has %v after a denied write", files)
			}
		})
	}
}

func TestCallNeedingApprovalWithoutInteractiveRequesterFailsWithoutPrompt(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	tests := []struct {
		name      string
		transport string
		kind      schemas.SenderKind
	}{
		{"a bot sender on an interactive transport", "cli", schemas.SenderBot},
		{"a service sender on an interactive transport", "cli", schemas.SenderService},
		{"a user on the non-interactive webhook transport", "webhook", schemas.SenderUser},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			m := h.Inbound("noint-"+tc.transport+string(tc.kind), "robot",
				pt.Call("write_file", `{"path":"x.txt","content":"x"}`), pt.Call("echo", `{"text":"still runs"}`))
			m.Transport, m.Sender.Kind = tc.transport, tc.kind
			turn := h.Send(m)
			b, out := h.WaitTerminal(turn)
			if b.Context.Interactive {
				t.Fatalf("context is interactive: %+v", b.Context)
			}
			r := b.Results[0]
			if r.Status != schemas.ResultFailed || r.Code != schemas.CodeNoInteractiveRequest {
				t.Fatalf("write_file result %+v, want failed NO_INTERACTIVE_REQUESTER", r)
			}
			if e := b.Results[1]; e.Status != schemas.ResultOK || e.Output != "still runs" {
				t.Fatalf("echo result %+v, want ok: only the call needing approval fails", e)
			}
			if out.State != schemas.TurnCompleted {
				t.Fatalf("outcome %s", out.State)
			}
			if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
				t.Fatalf("approval record %+v created that nobody could answer", a)
			}
			if n := len(h.Requested(turn)); n != 0 {
				t.Fatalf("%d approval-requested events that nobody could answer", n)
			}
			if _, ok := h.File("x.txt"); ok {
				t.Fatal("file written")
			}
		})
	}
}

func TestExecutorFailsClosedOnAnUnusableTurnContext(t *testing.T) {
	count := &pt.Counter{ToolName: "free"}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}})
	valid := func(turn string) *schemas.TurnContext {
		tc := &schemas.TurnContext{
			V: schemas.TurnContextVersion, SessionID: "fc-" + turn, TurnID: turn,
			Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
			Transport: "cli", Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
			Audience: schemas.AudiencePersonal, TrustBoundary: "local", Interactive: true, CreatedAt: time.Now().UTC(),
		}
		if err := h.Keys.Seal(tc); err != nil {
			t.Fatal(err)
		}
		return tc
	}
	otherKeys, err := seal.NewFile("k9").Ring()
	if err != nil {
		t.Fatal(err)
	}
	reseal := func(c *schemas.TurnContext) {
		if err := h.Keys.Seal(c); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		mangle func(t *schemas.AcceptedTurn)
		code   schemas.Code
	}{
		{"no TurnContext at all", func(t *schemas.AcceptedTurn) { t.Context = nil }, schemas.CodeTurnContextMissing},
		{"a validly sealed TurnContext of another turn", func(t *schemas.AcceptedTurn) { t.Context.TurnID = "t-someoneelse"; reseal(t.Context) }, schemas.CodeTurnContextMismatch},
		{"a TurnContext whose audience was widened after sealing", func(t *schemas.AcceptedTurn) { t.Context.Audience = schemas.AudiencePublic }, schemas.CodeTurnContextTampered},
		{"a TurnContext whose requester was swapped after sealing", func(t *schemas.AcceptedTurn) {
			t.Context.Requester.Principal, t.Context.Requester.SenderID = "cli:mallory", "mallory"
		}, schemas.CodeTurnContextTampered},
		{"a TurnContext stripped of its seal", func(t *schemas.AcceptedTurn) { t.Context.Seal = nil }, schemas.CodeTurnContextTampered},
		{"a TurnContext sealed with a key not in the ring", func(t *schemas.AcceptedTurn) {
			if err := otherKeys.Seal(t.Context); err != nil {
				panic(err)
			}
		}, schemas.CodeSealKeyUnknown},
		{"a TurnContext of an unknown schema version", func(t *schemas.AcceptedTurn) { t.Context.V = 99 }, schemas.CodeSchemaVersionUnsupported},
		{"a TurnContext without an audience", func(t *schemas.AcceptedTurn) { t.Context.Audience = "" }, schemas.CodeTurnContextInvalid},
		{"calls whose ids were steered", func(t *schemas.AcceptedTurn) { t.Calls[0].CallID = "t-other-0" }, schemas.CodeInvalidInput},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn := schemas.TurnID("cli", h.NextID("forged"))
			args, digest, _ := schemas.CanonicalArgs(`{"i":1}`)
			at := &schemas.AcceptedTurn{
				TurnID: turn, Context: valid(turn), AcceptedAt: time.Now().UTC(),
				Calls: []schemas.ToolCall{{CallID: schemas.CallID(turn, 0), Index: 0, Tool: "free", Args: args, ArgsDigest: digest}},
			}
			tc.mangle(at)
			h.Publish(topology.AcceptedSubject(schemas.SessionKey("cli", "fc")), at.TurnID, at)
			b, out := h.WaitTerminal(turn)
			if b.State != schemas.BatchFailed || b.Code != tc.code {
				t.Fatalf("batch %s %s (%s), want failed %s", b.State, b.Code, b.Reason, tc.code)
			}
			if r := b.Results[0]; r == nil || r.Status != schemas.ResultFailed || r.Code != tc.code {
				t.Fatalf("result %+v, want failed %s", r, tc.code)
			}
			if out.State != schemas.TurnFailed || out.Code != tc.code {
				t.Fatalf("outcome %s %s, want failed %s", out.State, out.Code, tc.code)
			}
			if count.Total() != 0 {
				t.Fatalf("tool ran %d times under an unusable context (case %d)", count.Total(), i)
			}
		})
	}
}

func TestRedeliveredAcceptedTurnRunsItsCallsOnce(t *testing.T) {
	count := &pt.Counter{ToolName: "free"}
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("redeliver", "alice", pt.Call("free", `{}`), pt.Call("write_file", `{"path":"r.txt","content":"1"}`)))
	h.WaitPending(schemas.ApprovalID(turn, 1))
	h.WaitRequested(turn, 1)

	// The accepted turn as stored, republished under fresh message ids
	// (bypassing the stream's dedupe) while the batch awaits approval...
	accepted := h.Messages(topology.StreamTurns, topology.SubjectTurnOrder+">")
	if len(accepted) != 1 {
		t.Fatalf("%d accepted turns stored, want 1", len(accepted))
	}
	for i := range 3 {
		seq := h.PublishRaw(accepted[0].Subject, h.NextID("again"), accepted[0].Data, nil)
		h.WaitConsumed(pt.Executor, seq)
		if i == 0 && len(h.Requested(turn)) != 1 {
			t.Fatalf("approval re-requested on redelivery: %d events", len(h.Requested(turn)))
		}
	}
	h.Decide(schemas.ApprovalID(turn, 1), schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)
	// ...and again after it completed.
	seq := h.PublishRaw(accepted[0].Subject, h.NextID("again"), accepted[0].Data, nil)
	h.WaitConsumed(pt.Executor, seq)
	h.WaitIdle(pt.Executor, pt.Redriver)

	if b.State != schemas.BatchCompleted || count.Runs(schemas.CallID(turn, 0)) != 1 || count.Total() != 1 {
		t.Fatalf("batch %s, free ran %d times, want completed and once", b.State, count.Total())
	}
	if c, ok := h.File("r.txt"); !ok || c != "1" {
		t.Fatalf("approved write: exists=%v %q", ok, c)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcome events, want 1", n)
	}
	if n := len(h.Requested(turn)); n != 1 {
		t.Fatalf("%d approval-requested events, want 1", n)
	}
	if after := h.Batch(turn); after.State != schemas.BatchCompleted || !reflect.DeepEqual(after.Results, b.Results) {
		t.Fatalf("batch changed after redelivery: %+v", after)
	}
}

func TestConcurrentExecutorsOnOneTurnRunEachCallOnce(t *testing.T) {
	count := &pt.Counter{ToolName: "free"}
	// No stages run: the test plays several executor workers itself.
	h := pt.Start(t, pt.Options{Policy: testPolicy, Tools: []tools.Tool{count}, Stages: []string{}})
	msg := h.Inbound("concurrent", "alice", pt.Call("free", `{"a":1}`), pt.Call("free", `{"a":2}`), pt.Call("echo", `{"text":"e"}`))
	at := h.Accept(msg)

	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := h.Ctx()
			defer cancel()
			// A worker whose call is claimed by another retries, as a
			// redelivery would.
			for {
				err := h.Executor.Accept(ctx, at)
				if err == nil || ctx.Err() != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("worker: %v", err)
		}
	}
	b, _ := h.WaitTerminal(at.TurnID)
	if b.State != schemas.BatchCompleted {
		t.Fatalf("batch %s", b.State)
	}
	for i := range 2 {
		if n := count.Runs(schemas.CallID(at.TurnID, i)); n != 1 {
			t.Fatalf("call %d ran %d times across %d workers, want 1", i, n, workers)
		}
	}
	if n := len(h.Outcomes(at.TurnID)); n != 1 {
		t.Fatalf("%d outcomes", n)
	}
}

func TestSessionRunsOneBatchAtATimeInArrivalOrder(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	first := h.Send(h.Inbound("ordered", "alice", pt.Call("write_file", `{"path":"first.txt","content":"1"}`)))
	h.WaitPending(schemas.ApprovalID(first, 0))
	second := h.Send(h.Inbound("ordered", "alice", pt.Call("echo", `{"text":"2"}`)))
	third := h.Send(h.Inbound("ordered", "alice", pt.Call("echo", `{"text":"3"}`)))

	// Both later turns wait, each at its place in the session's order:
	// queued, behind the turn before it.
	jstest.Eventually(t, pt.Wait, "both later turns queued", func() bool {
		b2, b3 := h.Batch(second), h.Batch(third)
		return b2 != nil && b3 != nil
	})
	if got := h.Order("ordered"); !slices.Equal(got, []string{first, second, third}) {
		t.Fatalf("the session's order is %v, want [%s %s %s]", got, first, second, third)
	}
	if b2, b3 := h.Batch(second), h.Batch(third); b2.OrderAfter != first || b3.OrderAfter != second {
		t.Fatalf("the later turns wait behind %q and %q, want %s and %s", b2.OrderAfter, b3.OrderAfter, first, second)
	}
	if s := h.Session("ordered"); s != nil {
		t.Fatalf("a session record was written: %+v (the order alone decides)", s)
	}
	for _, turn := range []string{second, third} {
		if b := h.Batch(turn); b.State != schemas.BatchQueued || b.Results[0] != nil {
			t.Fatalf("turn %s is %s with results %v while its session is busy, want queued", turn, b.State, b.Results)
		}
	}

	// Another session is not held up.
	other := h.Send(h.Inbound("other", "bob", pt.Call("echo", `{"text":"other"}`)))
	if b, _ := h.WaitTerminal(other); b.State != schemas.BatchCompleted {
		t.Fatalf("other session's turn %s", b.State)
	}
	if b := h.Batch(second); b.State != schemas.BatchQueued {
		t.Fatalf("second turn moved to %s while the first awaits approval", b.State)
	}

	h.Decide(schemas.ApprovalID(first, 0), schemas.OptionApprove, "alice")
	var ended []time.Time
	for _, turn := range []string{first, second, third} {
		b, _ := h.WaitTerminal(turn)
		if b.State != schemas.BatchCompleted {
			t.Fatalf("turn %s %s", turn, b.State)
		}
		// The turns' logs are on different streams of one server: their
		// outcome events' stored times are on one clock.
		ended = append(ended, h.OutcomeEvent(turn).Time)
	}
	if !slices.IsSortedFunc(ended, time.Time.Compare) {
		t.Fatalf("outcome events stored at %v: turns did not complete in arrival order", ended)
	}
	if c, ok := h.File("first.txt"); !ok || c != "1" {
		t.Fatalf("first turn's approved write: exists=%v %q", ok, c)
	}
	jstest.Eventually(t, pt.Wait, "session released", func() bool {
		return h.SessionFree("ordered")
	})
}

func TestUnknownToolFailsWithoutAPrompt(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	// The default policy sends unlisted tools for approval; a tool that is
	// not registered could only end in TOOL_NOT_FOUND, so nobody is asked.
	turn := h.Send(h.Inbound("unknown-tool", "alice", pt.Call("send_email", `{"to":"x"}`), pt.Call("echo", `{"text":"e"}`)))
	b, out := h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultFailed || r.Code != schemas.CodeToolNotFound {
		t.Fatalf("result %+v, want failed TOOL_NOT_FOUND", r)
	}
	if b.Results[1].Status != schemas.ResultOK || out.State != schemas.TurnCompleted {
		t.Fatalf("batch %+v", b)
	}
	if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
		t.Fatalf("approval record for an unknown tool: %+v", a)
	}
	if n := len(h.Requested(turn)); n != 0 {
		t.Fatalf("%d approval-requested events", n)
	}
}

func TestBadTurnsAreDeadLetteredAndTheExecutorKeepsGoing(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{pt.Executor}})
	key := schemas.SessionKey("cli", "dlq")
	raw := func(v any) []byte {
		b, err := msgpack.Marshal(v)
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
		{"an accepted turn that is not msgpack", topology.AcceptedSubject(key), []byte("turn"), schemas.CodeMalformed},
		{"an accepted turn of an unknown version", topology.AcceptedSubject(key), raw(map[string]any{"v": 9, "turn_id": "t-x"}), schemas.CodeSchemaVersionUnsupported},
		{"an accepted turn whose id is not a key", topology.AcceptedSubject(key), raw(map[string]any{"v": 1, "turn_id": "t x"}), schemas.CodeInvalidInput},
		{"a ready notice for a turn with no batch", topology.ReadySubject(key), raw(map[string]any{"v": 1, "turn_id": "t-none", "kind": "ready"}), schemas.CodeBatchRecordMissing},
		// Other subjects of TOLLGATE_TURNS (follow-up schedules) are not in
		// the executor's filter at all, so none reaches it.
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			seq := h.PublishRaw(tc.subject, "", tc.data, nil)
			dls := h.WaitDLQ(pt.Executor, i+1)
			dl := dls[len(dls)-1]
			if dl.Header.Get(runner.HeaderCode) != string(tc.code) || string(dl.Data) != string(tc.data) || dl.Header.Get(runner.HeaderOriginalSeq) != fmt.Sprint(seq) {
				t.Fatalf("dead letter %v %q, want %s with the original bytes of seq %d", dl.Header, dl.Data, tc.code, seq)
			}
		})
	}
	// A valid turn after them still runs.
	at := h.Accept(h.Inbound("dlq", "alice", pt.Call("echo", `{"text":"fine"}`)))
	h.Publish(topology.AcceptedSubject(key), at.TurnID, at)
	if b, _ := h.WaitTerminal(at.TurnID); b.Results[0].Output != "fine" {
		t.Fatalf("result %+v", b.Results[0])
	}
}

// The approvals of a batch are announced only once it waits for them, and
// a stage that stops between the awaiting write and the announcements
// (here: fails there, as a crash would leave it) announces them when its
// message comes back and finds the batch waiting. Exactly one
// approval-requested event is stored.
func TestApprovalsCutOffFromTheirAnnouncementAreAnnouncedOnRedelivery(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	var calls atomic.Int32
	executor.SetBeforeAnnounce(h.Executor, func(string) error {
		if calls.Add(1) == 1 {
			return errors.New("the executor stops before announcing")
		}
		return nil
	})
	turn := h.Send(h.Inbound("cut-off", "alice", pt.Call("write_file", `{"path":"cut/a.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitState(turn, schemas.BatchAwaiting)
	var reqs []*schemas.ApprovalRecord
	jstest.Eventually(t, pt.Wait, "the approval announced after the redelivery", func() bool {
		reqs = h.Requested(turn)
		return len(reqs) > 0
	})
	h.WaitIdle(pt.Executor)
	if reqs = h.Requested(turn); len(reqs) != 1 || reqs[0].ApprovalID != id || reqs[0].Status != schemas.ApprovalPending {
		t.Fatalf("approval-requested events %+v, want one, pending, for %s", reqs, id)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the announcement step ran %d times, want once (the redelivery found the batch waiting and announced from there)", n)
	}
	if b := h.Batch(turn); b.State != schemas.BatchAwaiting || b.Approvals[0] != id {
		t.Fatalf("batch %s approvals %v, want awaiting on %s", b.State, b.Approvals, id)
	}
}

func encoded(t *testing.T, r schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
