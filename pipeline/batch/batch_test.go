package batch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const lease = time.Minute

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

type fixture struct {
	env   *jstest.Env
	st    *store.Store
	eng   *batch.Engine
	clock *clock
	count *pt.Counter
	fail  *failing
	safe  *retrySafe
}

// retrySafe counts runs and declares itself safe to run again.
type retrySafe struct{ pt.Counter }

func (*retrySafe) RetrySafe() bool { return true }

// failing is a tool that always returns an error.
type failing struct{ runs atomic.Int32 }

func (*failing) Name() string { return "fails" }
func (f *failing) Run(context.Context, tools.Call) (string, error) {
	f.runs.Add(1)
	return "partial", errors.New("disk full")
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{env: jstest.Start(t), clock: &clock{}, count: &pt.Counter{}, fail: &failing{}, safe: &retrySafe{pt.Counter{ToolName: "idempotent"}}}
	f.clock.Set(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	f.st = store.New(f.env.Buckets)
	reg, err := tools.NewCatalog(context.Background(), []tools.Tool{f.count, f.fail, f.safe}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.eng, err = batch.New(batch.Config{JS: f.env.JS, Store: f.st, Tools: reg, Keys: pt.Keys(t), Worker: "test@1", Logger: pt.Logger(),
		ClaimLease: lease, ToolTimeout: time.Second, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// turnContext is a context for turn sealed with the test binary's keys
// (pipelinetest.Keys), as ingest would have made it.
func turnContext(turn string) *schemas.TurnContext {
	return turnContextIn(turn, "sess-"+turn)
}

// turnContextIn is the sealed context of turn in session session of the
// cli transport, as ingest would make it.
func turnContextIn(turn, session string) *schemas.TurnContext {
	tc := &schemas.TurnContext{
		V: schemas.TurnContextVersion, SessionID: session, SessionKey: schemas.SessionKey("cli", session), TurnID: turn,
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
		Transport: "cli", Channel: schemas.Channel{ID: "C1", Kind: schemas.ChannelPrivate, Thread: "th"},
		Audience: schemas.AudienceTeam, TrustBoundary: "local", Interactive: true,
	}
	if err := pt.Keys(nil).Seal(tc); err != nil {
		panic(err)
	}
	return tc
}

func call(turn string, i int, tool, args string) schemas.ToolCall {
	canon, digest, err := schemas.CanonicalArgs(args)
	if err != nil {
		panic(err)
	}
	return schemas.ToolCall{CallID: schemas.CallID(turn, i), Index: i, Tool: tool, Args: canon, ArgsDigest: digest}
}

// same compares two values by their msgpack encoding (times compare by
// instant, not by location).
func same(a, b any) bool {
	x, err1 := msgpack.Marshal(a)
	y, err2 := msgpack.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestExecuteRunsACallAtMostOnce(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "once")
	tc, c := turnContext(turn), call(turn, 0, "count", `{"x":1}`)

	first, err := f.eng.Execute(ctx(t), tc, c, "a-1")
	if err != nil || first.Status != schemas.ResultOK || first.ApprovalID != "a-1" {
		t.Fatalf("first execute: %+v %v", first, err)
	}
	f.clock.Advance(10 * lease) // long after: the recorded result still stands
	again, err := f.eng.Execute(ctx(t), tc, c, "a-1")
	if err != nil || !same(again, first) {
		t.Fatalf("second execute returned %+v %v, want the recorded %+v", again, err, first)
	}
	if n := f.count.Runs(c.CallID); n != 1 {
		t.Fatalf("tool ran %d times, want 1", n)
	}
	claim, _, err := f.st.Claims.Get(ctx(t), c.CallID)
	if err != nil || claim.Result == nil || !strings.HasPrefix(claim.Worker, "test@1#") || claim.ArgsDigest != c.ArgsDigest || claim.TurnID != turn {
		t.Fatalf("claim %+v %v", claim, err)
	}
}

func TestConcurrentExecutesRunTheToolOnce(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "race")
	tc, c := turnContext(turn), call(turn, 0, "count", `{}`)
	const workers = 16
	results := make(chan *schemas.ToolResult, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := f.eng.Execute(context.Background(), tc, c, "")
			if err != nil {
				errs <- err
				return
			}
			results <- r
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		if !errors.Is(err, batch.ErrClaimHeld) {
			t.Fatalf("a losing worker got %v, want ErrClaimHeld", err)
		}
	}
	for r := range results {
		if r.Status != schemas.ResultOK {
			t.Fatalf("result %+v", r)
		}
	}
	if n := f.count.Runs(c.CallID); n != 1 {
		t.Fatalf("tool ran %d times under %d concurrent workers, want 1", n, workers)
	}
}

func TestExecuteWithAClaimButNoResult(t *testing.T) {
	tests := []struct {
		name     string
		age      time.Duration
		wantHeld bool
	}{
		{"a claim younger than the lease is held by its worker", lease - time.Second, true},
		{"a claim just inside the lease is still held", lease - time.Nanosecond, true},
		{"a claim at the lease is uncertain", lease, false},
		{"a claim older than the lease is uncertain", 3 * lease, false},
	}
	f := newFixture(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			turn := schemas.TurnID("cli", fmt.Sprintf("orphan%d", i))
			c := call(turn, 0, "count", `{}`)
			claimedAt := f.clock.Now().Add(-tc.age)
			orphan := &schemas.ExecutionClaim{CallID: c.CallID, TurnID: turn, Tool: c.Tool, ArgsDigest: c.ArgsDigest, Worker: "crashed@2", ClaimedAt: claimedAt}
			if _, err := f.st.Claims.Create(ctx(t), c.CallID, orphan); err != nil {
				t.Fatal(err)
			}
			res, err := f.eng.Execute(ctx(t), turnContext(turn), c, "a-x")
			stored, _, gerr := f.st.Claims.Get(ctx(t), c.CallID)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if tc.wantHeld {
				if !errors.Is(err, batch.ErrClaimHeld) || res != nil {
					t.Fatalf("got %+v %v, want ErrClaimHeld", res, err)
				}
				if stored.Result != nil {
					t.Fatalf("a held claim was given a result: %+v", stored.Result)
				}
			} else {
				if err != nil || res.Status != schemas.ResultNeedsAttention || res.Code != schemas.CodeExecutionUncertain || res.ApprovalID != "a-x" {
					t.Fatalf("got %+v %v, want needs_attention EXECUTION_UNCERTAIN", res, err)
				}
				if stored.Result == nil || !same(stored.Result, res) || stored.Worker != "crashed@2" {
					t.Fatalf("claim not marked uncertain: %+v", stored)
				}
				// And it stays so: asked again, the same answer, no run.
				again, err := f.eng.Execute(ctx(t), turnContext(turn), c, "a-x")
				if err != nil || !same(again, res) {
					t.Fatalf("again: %+v %v", again, err)
				}
			}
			if n := f.count.Runs(c.CallID); n != 0 {
				t.Fatalf("tool ran %d times on a call that may already have run", n)
			}
		})
	}
}

func TestARetrySafeToolIsRunAgainAfterTheLeaseOfAClaimWithoutResult(t *testing.T) {
	f := newFixture(t)
	for i, tt := range []struct {
		name    string
		age     time.Duration
		wantRun bool
	}{
		{"inside the lease the claim is still held", lease - time.Second, false},
		{"after the lease the call runs again under a taken-over claim", lease + time.Second, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			turn := schemas.TurnID("cli", fmt.Sprintf("retry%d", i))
			c := call(turn, 0, "idempotent", `{}`)
			orphan := &schemas.ExecutionClaim{CallID: c.CallID, TurnID: turn, Tool: c.Tool, ArgsDigest: c.ArgsDigest, Worker: "crashed@2", ClaimedAt: f.clock.Now().Add(-tt.age)}
			if _, err := f.st.Claims.Create(ctx(t), c.CallID, orphan); err != nil {
				t.Fatal(err)
			}
			res, err := f.eng.Execute(ctx(t), turnContext(turn), c, "")
			if !tt.wantRun {
				if !errors.Is(err, batch.ErrClaimHeld) || f.safe.Runs(c.CallID) != 0 {
					t.Fatalf("got %+v %v, runs %d; want ErrClaimHeld and no run", res, err, f.safe.Runs(c.CallID))
				}
				return
			}
			if err != nil || res.Status != schemas.ResultOK || f.safe.Runs(c.CallID) != 1 {
				t.Fatalf("got %+v %v, runs %d; want one run and ok", res, err, f.safe.Runs(c.CallID))
			}
			stored, _, _ := f.st.Claims.Get(ctx(t), c.CallID)
			if stored.Worker != f.eng.Worker() || stored.Result == nil || stored.Result.Status != schemas.ResultOK {
				t.Fatalf("claim %+v, want taken over by %s with the result", stored, f.eng.Worker())
			}
			// Recorded now: asked again, it does not run a third time.
			if again, err := f.eng.Execute(ctx(t), turnContext(turn), c, ""); err != nil || !same(again, res) || f.safe.Runs(c.CallID) != 1 {
				t.Fatalf("again: %+v %v, runs %d", again, err, f.safe.Runs(c.CallID))
			}
		})
	}
}

func TestExecuteFailsClosedWithoutClaiming(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "closed")
	good := call(turn, 0, "count", `{"k":"v"}`)
	tests := []struct {
		name string
		tc   func() *schemas.TurnContext
		call func() schemas.ToolCall
		code schemas.Code
	}{
		{"no TurnContext", func() *schemas.TurnContext { return nil }, func() schemas.ToolCall { return good }, schemas.CodeTurnContextMissing},
		{"a TurnContext of an unknown version", func() *schemas.TurnContext {
			tc := turnContext(turn)
			tc.V = 3
			return tc
		}, func() schemas.ToolCall { return good }, schemas.CodeSchemaVersionUnsupported},
		{"an unsealed TurnContext", func() *schemas.TurnContext {
			tc := turnContext(turn)
			tc.Seal = nil
			return tc
		}, func() schemas.ToolCall { return good }, schemas.CodeTurnContextTampered},
		{"a TurnContext edited after sealing", func() *schemas.TurnContext {
			tc := turnContext(turn)
			tc.Audience = schemas.AudiencePublic
			return tc
		}, func() schemas.ToolCall { return good }, schemas.CodeTurnContextTampered},
		{"an incomplete TurnContext", func() *schemas.TurnContext {
			tc := turnContext(turn)
			tc.Requester.Principal = ""
			return tc
		}, func() schemas.ToolCall { return good }, schemas.CodeTurnContextInvalid},
		{"a call of another turn", func() *schemas.TurnContext { return turnContext(turn) },
			func() schemas.ToolCall { return call(schemas.TurnID("cli", "other"), 0, "count", `{}`) }, schemas.CodeTurnContextMismatch},
		{"a call id that merely starts with the turn id", func() *schemas.TurnContext { return turnContext(turn) },
			func() schemas.ToolCall { c := good; c.CallID = turn + "0"; return c }, schemas.CodeTurnContextMismatch},
		{"arguments that do not match their digest", func() *schemas.TurnContext { return turnContext(turn) },
			func() schemas.ToolCall { c := good; c.Args = `{"k":"w"}`; return c }, schemas.CodeArgsDigestMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.call()
			res, err := f.eng.Execute(ctx(t), tc.tc(), c, "")
			if err != nil || res.Status != schemas.ResultFailed || res.Code != tc.code {
				t.Fatalf("got %+v %v, want failed %s", res, err, tc.code)
			}
			if _, _, err := f.st.Claims.Get(ctx(t), c.CallID); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("a claim was taken for a call that must not run: %v", err)
			}
		})
	}
	if n := f.count.Total(); n != 0 {
		t.Fatalf("tool ran %d times", n)
	}
}

func TestToolErrorIsRecordedAndNotRetried(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "fails")
	c := call(turn, 0, "fails", `{}`)
	for range 2 {
		res, err := f.eng.Execute(ctx(t), turnContext(turn), c, "")
		if err != nil || res.Status != schemas.ResultError || res.Code != schemas.CodeToolFailed || res.Reason != "disk full" || res.Output != "partial" {
			t.Fatalf("got %+v %v, want error TOOL_FAILED", res, err)
		}
	}
	if n := f.fail.runs.Load(); n != 1 {
		t.Fatalf("failing tool ran %d times, want 1", n)
	}
}

func newBatch(t testing.TB, f *fixture, turn string, state schemas.BatchState, calls ...schemas.ToolCall) *schemas.BatchRecord {
	t.Helper()
	return newBatchAs(t, f, turn, state, nil, calls...)
}

// newBatchAs is newBatch with the record made by as (nil: as it is), such
// as schemas.AsLegacyBatch for one an earlier version left in the bucket.
func newBatchAs(t testing.TB, f *fixture, turn string, state schemas.BatchState, as func(*schemas.BatchRecord) *schemas.BatchRecord, calls ...schemas.ToolCall) *schemas.BatchRecord {
	t.Helper()
	b := &schemas.BatchRecord{
		TurnID: turn, SessionID: "sess-" + turn, Context: turnContext(turn), Calls: calls, State: state,
		Approvals: make([]string, len(calls)), Results: make([]*schemas.ToolResult, len(calls)),
	}
	if as != nil {
		b = as(b)
	}
	if _, err := f.st.Batches.Create(ctx(t), turn, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEndReachesExactlyOneTerminalState(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "end")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	newBatch(t, f, turn, schemas.BatchStarted, c0, c1)

	const enders = 10
	out := make([]*schemas.BatchRecord, enders)
	var wg sync.WaitGroup
	for i := range enders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 {
				ok := f.eng.Result(c0, schemas.ResultOK, "", "", "")
				ok.Output = fmt.Sprint(i)
				out[i], err = f.eng.End(context.Background(), turn, []*schemas.ToolResult{ok}, "", "")
			} else {
				out[i], err = f.eng.End(context.Background(), turn, nil, schemas.CodeTurnContextMissing, fmt.Sprint(i))
			}
			if err != nil {
				t.Errorf("end %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	stored, _, err := f.st.Batches.Get(ctx(t), turn)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range out {
		if b == nil || !same(b, stored) {
			t.Fatalf("ender %d saw %+v, stored is %+v: two terminal states", i, b, stored)
		}
	}
	switch stored.State {
	case schemas.BatchCompleted:
		if stored.Results[0] == nil || stored.Results[1] != nil || stored.Code != "" {
			t.Fatalf("completed batch %+v", stored)
		}
	case schemas.BatchFailed:
		for _, r := range stored.Results {
			if r == nil || r.Status != schemas.ResultFailed || r.Code != schemas.CodeTurnContextMissing {
				t.Fatalf("failed batch result %+v: every call without a result must fail with the code", r)
			}
		}
	default:
		t.Fatalf("state %s", stored.State)
	}
}

func TestFinishPublishesTheOutcomeOnceAndRefusesNonTerminal(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	turn := schemas.TurnID("cli", "finish")
	b := newBatch(t, f, turn, schemas.BatchAwaiting, call(turn, 0, "count", `{}`))
	if err := f.eng.Finish(ctx(t), b); err == nil {
		t.Fatal("Finish of an awaiting batch succeeded")
	}
	if n := len(h.Outcomes(turn)); n != 0 {
		t.Fatalf("%d outcomes for a non-terminal batch", n)
	}
	end, err := f.eng.End(ctx(t), turn, nil, schemas.CodeTurnContextMismatch, "tampered")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.eng.Finish(ctx(t), end); err != nil {
			t.Fatal(err)
		}
	}
	outs := h.Outcomes(turn)
	if len(outs) != 1 {
		t.Fatalf("%d outcome events, want 1", len(outs))
	}
	o := outs[0]
	want := schemas.ReplyTarget{Transport: "cli", Channel: schemas.Channel{ID: "C1", Kind: schemas.ChannelPrivate, Thread: "th"}}
	if o.State != schemas.TurnFailed || o.Code != schemas.CodeTurnContextMismatch || o.Reply != want || o.Audience != schemas.AudienceTeam {
		t.Fatalf("outcome %+v", o)
	}
}

// An outcome is addressed only by a context that verifies and belongs to
// its turn; any other goes nowhere, carries only the failure code, and
// none of the results (calls may have run for the real requester).
func TestOutcomeIsAddressedOnlyByAVerifiedContextOfItsTurn(t *testing.T) {
	const turn = "t-outcome"
	dm := schemas.ReplyTarget{Transport: "cli", Channel: schemas.Channel{ID: "C1", Kind: schemas.ChannelPrivate, Thread: "th"}}
	edited := func(edit func(*schemas.TurnContext)) *schemas.TurnContext {
		tc := turnContext(turn)
		edit(tc)
		return tc
	}
	type routed struct {
		State    schemas.TurnState
		Code     schemas.Code
		Reply    schemas.ReplyTarget
		Audience schemas.Audience
		Results  int
	}
	tests := []struct {
		name  string
		state schemas.BatchState
		code  schemas.Code
		tc    *schemas.TurnContext
		want  routed
	}{
		{"a completed batch with its turn's sealed context", schemas.BatchCompleted, "", turnContext(turn),
			routed{State: schemas.TurnCompleted, Reply: dm, Audience: schemas.AudienceTeam, Results: 1}},
		{"a failed batch with its turn's sealed context", schemas.BatchFailed, schemas.CodeArgsDigestMismatch, turnContext(turn),
			routed{State: schemas.TurnFailed, Code: schemas.CodeArgsDigestMismatch, Reply: dm, Audience: schemas.AudienceTeam, Results: 1}},
		{"no context", schemas.BatchFailed, schemas.CodeTurnContextMissing, nil,
			routed{State: schemas.TurnFailed, Code: schemas.CodeTurnContextMissing}},
		{"an unsealed context", schemas.BatchFailed, schemas.CodeTurnContextTampered, edited(func(tc *schemas.TurnContext) { tc.Seal = nil }),
			routed{State: schemas.TurnFailed, Code: schemas.CodeTurnContextTampered}},
		{"a context whose channel was re-pointed after sealing", schemas.BatchFailed, schemas.CodeTurnContextTampered,
			edited(func(tc *schemas.TurnContext) {
				tc.Channel = schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}
			}),
			routed{State: schemas.TurnFailed, Code: schemas.CodeTurnContextTampered}},
		{"a context whose seal names a key not in the ring", schemas.BatchFailed, schemas.CodeSealKeyUnknown,
			edited(func(tc *schemas.TurnContext) { tc.Seal.KeyID = "renamed" }),
			routed{State: schemas.TurnFailed, Code: schemas.CodeSealKeyUnknown}},
		{"another turn's sealed context", schemas.BatchFailed, schemas.CodeTurnContextMismatch, turnContext("t-other"),
			routed{State: schemas.TurnFailed, Code: schemas.CodeTurnContextMismatch}},
		{"a completed batch whose context was edited since", schemas.BatchCompleted, "",
			edited(func(tc *schemas.TurnContext) { tc.Audience = schemas.AudiencePublic }),
			routed{State: schemas.TurnCompleted, Code: schemas.CodeTurnContextTampered}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &schemas.BatchRecord{TurnID: turn, Context: tc.tc, State: tc.state, Code: tc.code,
				Results: []*schemas.ToolResult{{CallID: turn + "-0", Status: schemas.ResultOK, Output: "ran in the DM"}, nil}}
			o := batch.Outcome(pt.Keys(t), b)
			got := routed{State: o.State, Code: o.Code, Reply: o.Reply, Audience: o.Audience, Results: len(o.Results)}
			if got != tc.want {
				t.Fatalf("outcome\n  %+v\nwant\n  %+v", got, tc.want)
			}
		})
	}
}

func TestSessionQueueRunsTurnsInArrivalOrder(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	const session = "queue"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	turns := []string{"t-a", "t-b", "t-c", "t-d"}
	for _, turn := range turns {
		newBatch(t, f, turn, schemas.BatchQueued)
	}
	for i, turn := range turns {
		for range 2 { // a redelivered Acquire queues once
			active, err := f.eng.Acquire(ctx(t), sess, turn, 0, nil)
			if err != nil || active != (i == 0) {
				t.Fatalf("acquire %s: active=%v %v", turn, active, err)
			}
		}
	}
	s, _, err := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
	if err != nil || s.Active != "t-a" || !slices.Equal(s.Queue, []string{"t-b", "t-c", "t-d"}) {
		t.Fatalf("session %+v %v", s, err)
	}

	// t-b ended while queued (e.g. failed closed): Release passes over it.
	if _, err := f.eng.End(ctx(t), "t-b", nil, schemas.CodeTurnContextMissing, "x"); err != nil {
		t.Fatal(err)
	}
	if err := f.eng.Release(ctx(t), sess, "t-a"); err != nil {
		t.Fatal(err)
	}
	s, _, _ = f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
	if s.Active != "t-c" || !slices.Equal(s.Queue, []string{"t-d"}) {
		t.Fatalf("after release: active %s queue %v, want t-c [t-d]", s.Active, s.Queue)
	}
	ready := func() []string {
		var ids []string
		for _, n := range pt.DecodeAll[schemas.TurnNotice](t, h.Messages(topology.StreamTurns, topology.ReadySubject(schemas.SessionKey("cli", session)))) {
			if n.Kind != schemas.NoticeReady || n.SessionID != session {
				t.Fatalf("notice %+v", n)
			}
			ids = append(ids, n.TurnID)
		}
		return ids
	}
	if got := ready(); !slices.Equal(got, []string{"t-c"}) {
		t.Fatalf("ready notices %v, want [t-c]", got)
	}
	// A repeated Release by the old holder changes nothing and announces
	// nothing new (t-c is queued, its notice deduplicated).
	if err := f.eng.Release(ctx(t), sess, "t-a"); err != nil {
		t.Fatal(err)
	}
	if s2, _, _ := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session)); !reflect.DeepEqual(s2.Queue, s.Queue) || s2.Active != s.Active {
		t.Fatalf("repeated release moved the session: %+v", s2)
	}
	if got := ready(); !slices.Equal(got, []string{"t-c"}) {
		t.Fatalf("ready notices %v after a repeated release", got)
	}
	for _, turn := range []string{"t-c", "t-d"} {
		if _, err := f.eng.End(ctx(t), turn, nil, "", ""); err != nil {
			t.Fatal(err)
		}
		if err := f.eng.Release(ctx(t), sess, turn); err != nil {
			t.Fatal(err)
		}
	}
	// The last turn's release found no one queued and wrote nothing: the
	// record names the ended turn, whose terminal batch is the release.
	s, _, _ = f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
	if s.Active != "t-d" || len(s.Queue) != 0 {
		t.Fatalf("session %+v, want t-d named and nothing queued", s)
	}
	if got := ready(); !slices.Equal(got, []string{"t-c", "t-d"}) {
		t.Fatalf("ready notices %v, want [t-c t-d]", got)
	}
	// A session whose active turn has ended is taken at once.
	if active, err := f.eng.Acquire(ctx(t), sess, "t-e", 0, nil); err != nil || !active {
		t.Fatalf("acquire of a free session: %v %v", active, err)
	}
}

func TestConfigValidation(t *testing.T) {
	f := newFixture(t)
	reg, _ := tools.NewCatalog(context.Background(), nil, nil, nil)
	base := batch.Config{JS: f.env.JS, Store: f.st, Tools: reg, Keys: pt.Keys(t), Worker: "w", Logger: pt.Logger()}
	tests := []struct {
		name   string
		mutate func(*batch.Config)
		ok     bool
	}{
		{"defaults are valid", func(*batch.Config) {}, true},
		{"a worker name is required", func(c *batch.Config) { c.Worker = "" }, false},
		{"a store is required", func(c *batch.Config) { c.Store = nil }, false},
		{"the tool timeout must be below the claim lease", func(c *batch.Config) { c.ClaimLease, c.ToolTimeout = time.Minute, time.Minute }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mutate(&c)
			if _, err := batch.New(c); (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func BenchmarkExecuteClaimAndRecord(b *testing.B) {
	f := newFixture(b)
	turn := schemas.TurnID("cli", "bench")
	tc := turnContext(turn)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c := call(turn, i, "count", `{"i":1}`)
		i++
		if _, err := f.eng.Execute(context.Background(), tc, c, ""); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOutcome(b *testing.B) {
	turn, keys := schemas.TurnID("cli", "bench"), pt.Keys(b)
	rec := &schemas.BatchRecord{TurnID: turn, Context: turnContext(turn), State: schemas.BatchCompleted,
		Results: []*schemas.ToolResult{{CallID: turn + "-0", Status: schemas.ResultOK}, {CallID: turn + "-1", Status: schemas.ResultDenied}}}
	b.ReportAllocs()
	for b.Loop() {
		_ = batch.Outcome(keys, rec)
	}
}

// A claim this engine created whose reply it never saw (stored, but the
// create timed out) is resumed at once: the tool did not run. The same
// claim left by another engine, even one with the same configured worker
// name, is held until the lease runs out.
func TestExecuteResumesItsOwnClaimWhoseCreateReplyWasLost(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "own-claim")
	tc := turnContext(turn)
	for i, tt := range []struct {
		name   string
		worker string
		held   bool
	}{
		{"a claim of this engine", f.eng.Worker(), false},
		{"a claim of another engine with the same worker name", "test@1#00000000", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := call(turn, i, "count", `{}`)
			claim := &schemas.ExecutionClaim{CallID: c.CallID, TurnID: turn, Tool: c.Tool, ArgsDigest: c.ArgsDigest, Worker: tt.worker, ClaimedAt: f.clock.Now()}
			if _, err := f.st.Claims.Create(ctx(t), c.CallID, claim); err != nil {
				t.Fatal(err)
			}
			res, err := f.eng.Execute(ctx(t), tc, c, "")
			if tt.held {
				if !errors.Is(err, batch.ErrClaimHeld) || f.count.Runs(c.CallID) != 0 {
					t.Fatalf("got %+v %v, runs %d; want ErrClaimHeld and no run", res, err, f.count.Runs(c.CallID))
				}
				return
			}
			if err != nil || res.Status != schemas.ResultOK || f.count.Runs(c.CallID) != 1 {
				t.Fatalf("got %+v %v, runs %d; want the tool run once", res, err, f.count.Runs(c.CallID))
			}
			if got, _, _ := f.st.Claims.Get(ctx(t), c.CallID); got.Result == nil || got.Result.Status != schemas.ResultOK {
				t.Fatalf("result not recorded in the claim: %+v", got)
			}
		})
	}
}

// bumper rewrites its own claim unchanged while it runs, so the claim's
// revision moves under the engine: the conflict a replicated bucket can
// report for a write right after the holder's own.
type bumper struct {
	st   *store.Store
	runs atomic.Int32
}

func (*bumper) Name() string { return "bumps" }
func (b *bumper) Run(ctx context.Context, c tools.Call) (string, error) {
	b.runs.Add(1)
	if _, _, err := b.st.Claims.Mutate(ctx, c.CallID, func(*schemas.ExecutionClaim) error { return nil }); err != nil {
		return "", err
	}
	return "done", nil
}

func TestAResultIsRecordedDespiteAConflictOnItsOwnClaim(t *testing.T) {
	f := newFixture(t)
	bump := &bumper{st: f.st}
	reg, err := tools.NewCatalog(context.Background(), []tools.Tool{bump}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := batch.New(batch.Config{JS: f.env.JS, Store: f.st, Tools: reg, Keys: pt.Keys(t), Worker: "test@bump", Logger: pt.Logger(), ClaimLease: lease, ToolTimeout: time.Second, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	turn := schemas.TurnID("cli", "bumped")
	c := call(turn, 0, "bumps", `{}`)
	res, err := eng.Execute(ctx(t), turnContext(turn), c, "")
	if err != nil || res.Status != schemas.ResultOK || res.Output != "done" {
		t.Fatalf("got %+v %v, want the tool's ok result", res, err)
	}
	stored, _, err := f.st.Claims.Get(ctx(t), c.CallID)
	if err != nil || stored.Result == nil || !same(stored.Result, res) {
		t.Fatalf("claim %+v %v, want the result recorded", stored, err)
	}
	if n := bump.runs.Load(); n != 1 {
		t.Fatalf("tool ran %d times, want 1", n)
	}
}

func TestAcquireFromAStaleSnapshotReadsAgain(t *testing.T) {
	f := newFixture(t)
	for _, tt := range []struct {
		name  string
		stale func(t *testing.T, session string) *batch.SessionSnapshot
	}{
		{"a snapshot taken before another turn queued", func(t *testing.T, session string) *batch.SessionSnapshot {
			rec, rev, err := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
			if err != nil {
				t.Fatal(err)
			}
			return &batch.SessionSnapshot{Rec: rec, Rev: rev}
		}},
		{"a snapshot that says the session does not exist", func(*testing.T, string) *batch.SessionSnapshot {
			return &batch.SessionSnapshot{NotFound: true}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			session := "stale-" + tt.name[:12]
			sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
			if active, err := f.eng.Acquire(ctx(t), sess, "t-1", 1, nil); err != nil || !active {
				t.Fatalf("first turn: %v %v", active, err)
			}
			snap := tt.stale(t, session)
			if active, err := f.eng.Acquire(ctx(t), sess, "t-2", 2, nil); err != nil || active {
				t.Fatalf("second turn: %v %v", active, err)
			}
			if active, err := f.eng.Acquire(ctx(t), sess, "t-3", 3, snap); err != nil || active {
				t.Fatalf("third turn from a stale snapshot: %v %v", active, err)
			}
			s, _, err := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
			if err != nil {
				t.Fatal(err)
			}
			if s.Active != "t-1" || fmt.Sprint(s.Queue) != "[t-2 t-3]" || s.InboundSeq != 3 {
				t.Fatalf("session %+v, want t-1 active, [t-2 t-3] queued, watermark 3", s)
			}
		})
	}
}

// ConcludeFrom compare-and-sets from the records the stage holds; records
// that changed since must cost a re-read, never a lost write or a skipped
// release.
func TestConcludeFromStaleRecordsLosesNothing(t *testing.T) {
	t.Run("a turn queued behind the session's holder after it took the session is promoted", func(t *testing.T) {
		f := newFixture(t)
		h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
		const turn, next = "t-held", "t-next"
		session := "sess-" + turn
		sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
		c0 := call(turn, 0, "count", `{}`)
		newBatch(t, f, turn, schemas.BatchRunning, c0)
		newBatch(t, f, next, schemas.BatchQueued)
		b, rev, err := f.st.Batches.Get(ctx(t), turn)
		if err != nil {
			t.Fatal(err)
		}
		if active, err := f.eng.Acquire(ctx(t), sess, turn, 0, nil); err != nil || !active {
			t.Fatalf("acquire: %v %v", active, err)
		}
		if active, err := f.eng.Acquire(ctx(t), sess, next, 0, nil); err != nil || active {
			t.Fatalf("acquire of the next turn: %v %v", active, err)
		}
		res := f.eng.Result(c0, schemas.ResultOK, "", "", "")
		end, err := f.eng.ConcludeFrom(ctx(t), turn, batch.Known{Batch: b, BatchRev: rev}, []*schemas.ToolResult{res}, "", "")
		if err != nil || end.State != schemas.BatchCompleted {
			t.Fatalf("conclude: %+v %v", end, err)
		}
		s, _, _ := f.st.Sessions.Get(ctx(t), schemas.SessionKey("cli", session))
		if s.Active != next || len(s.Queue) != 0 {
			t.Fatalf("session after the release: active %q queue %v, want %s and none", s.Active, s.Queue, next)
		}
		notices := pt.DecodeAll[schemas.TurnNotice](t, h.Messages(topology.StreamTurns, topology.ReadySubject(schemas.SessionKey("cli", session))))
		if len(notices) != 1 || notices[0].TurnID != next {
			t.Fatalf("ready notices %+v, want one for %s", notices, next)
		}
	})
	t.Run("a batch aborted after the stage read it stays failed", func(t *testing.T) {
		f := newFixture(t)
		const turn = "t-aborted"
		c0 := call(turn, 0, "count", `{}`)
		newBatch(t, f, turn, schemas.BatchStarted, c0)
		b, rev, err := f.st.Batches.Get(ctx(t), turn)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.eng.Abort(ctx(t), turn, schemas.CodeRetriesExhausted, "gave up"); err != nil {
			t.Fatal(err)
		}
		res := f.eng.Result(c0, schemas.ResultOK, "", "", "")
		end, err := f.eng.ConcludeFrom(ctx(t), turn, batch.Known{Batch: b, BatchRev: rev}, []*schemas.ToolResult{res}, "", "")
		if err != nil {
			t.Fatal(err)
		}
		stored, _, _ := f.st.Batches.Get(ctx(t), turn)
		for _, got := range []*schemas.BatchRecord{end, stored} {
			if got.State != schemas.BatchFailed || got.Code != schemas.CodeRetriesExhausted || got.Results[0].Status == schemas.ResultOK {
				t.Fatalf("batch %s %s result %+v: the stale record's completion overwrote the abort", got.State, got.Code, got.Results[0])
			}
		}
	})
}

// The write that ends a batch is its turn's outcome event: the last event
// of the turn's log is named "outcome" and its record carries the turn's
// outcome as Outcome builds it, which is what Finish announces; a batch
// whose context does not verify ends with an outcome that goes nowhere and
// holds none of the results, while the batch keeps them.
func TestTheEndingWriteCarriesTheTurnsOutcome(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	tests := []struct {
		name    string
		edit    func(*schemas.TurnContext)
		code    schemas.Code
		state   schemas.TurnState
		results int
	}{
		{"a completed batch", nil, "", schemas.TurnCompleted, 1},
		{"a failed batch", nil, schemas.CodeArgsDigestMismatch, schemas.TurnFailed, 2},
		{"a completed batch whose context was edited since", func(tc *schemas.TurnContext) { tc.Audience = schemas.AudiencePublic }, "", schemas.TurnCompleted, 0},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			turn := schemas.TurnID("cli", fmt.Sprintf("ending-%d", i))
			c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
			newBatchAs(t, f, turn, schemas.BatchStarted, func(b *schemas.BatchRecord) *schemas.BatchRecord {
				if tc.edit != nil {
					tc.edit(b.Context)
				}
				return b
			}, c0, c1)
			var results []*schemas.ToolResult
			if tc.code == "" {
				results = []*schemas.ToolResult{f.eng.Result(c0, schemas.ResultOK, "", "", "")}
			}
			if _, err := f.eng.Conclude(ctx(t), turn, results, tc.code, "why"); err != nil {
				t.Fatal(err)
			}
			last, err := f.st.Batches.Log.Log.Last(ctx(t), turn)
			if err != nil || last.Name != store.EventOutcome {
				t.Fatalf("last event of %s: %+v, %v; want %q", turn, last, err, store.EventOutcome)
			}
			stored, _, err := f.st.Batches.Get(ctx(t), turn)
			if err != nil {
				t.Fatal(err)
			}
			o := stored.Outcome
			if o == nil || o.State != tc.state || len(o.Results) != tc.results || o.FinishedAt != stored.UpdatedAt {
				t.Fatalf("stored outcome %+v of batch %+v, want state %s with %d results", o, stored, tc.state, tc.results)
			}
			bare := *stored
			bare.Outcome = nil
			if want := batch.Outcome(pt.Keys(t), &bare); !same(o, want) {
				t.Fatalf("stored outcome\n  %+v\nwant Outcome's\n  %+v", o, want)
			}
			if n := len(slices.DeleteFunc(slices.Clone(stored.Results), func(r *schemas.ToolResult) bool { return r == nil })); tc.results == 0 && n == 0 {
				t.Fatalf("the batch lost its results: %+v", stored.Results)
			}
			if outs := h.Outcomes(turn); len(outs) != 1 || !same(&outs[0], o) {
				t.Fatalf("announced %+v, want the stored outcome %+v", outs, o)
			}
		})
	}
}
