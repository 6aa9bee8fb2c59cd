package batch_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// remoteFixture is an engine whose tools come from a provider the test
// changes.
type remoteFixture struct {
	st       *store.Store
	eng      *batch.Engine
	clock    *clock
	provider *pt.Provider
}

func newRemoteFixture(t *testing.T, ts ...tools.Tool) *remoteFixture {
	t.Helper()
	env := jstest.Start(t)
	f := &remoteFixture{st: store.New(env.Buckets), clock: &clock{}, provider: &pt.Provider{ProviderName: "nats"}}
	f.clock.Set(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	f.provider.Set(ts...)
	cat, err := tools.NewCatalog(ctx(t), nil, []tools.Provider{f.provider}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.eng, err = batch.New(batch.Config{JS: env.JS, Store: f.st, Tools: cat, Keys: pt.Keys(t), Worker: "test@remote", Logger: pt.Logger(),
		ClaimLease: lease, ToolTimeout: time.Second, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func remoteTool(name string, fail func(tools.Call) error) *pt.Remote {
	return &pt.Remote{Counter: pt.Counter{ToolName: name}, Fail: fail,
		Desc: tools.Spec{Source: "nats:svc", InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":false}`)}}
}

// claimResult returns the result recorded in the call's claim (nil when
// there is a claim without one); it fails the test if there is no claim.
func claimResult(t *testing.T, st *store.Store, callID string) *schemas.ToolResult {
	t.Helper()
	c, _, err := st.Claims.Get(ctx(t), callID)
	if err != nil {
		t.Fatalf("claim of %s: %v", callID, err)
	}
	return c.Result
}

// A call whose tool cannot run is refused with the catalog's code, and the
// refusal is recorded in its claim like any result: the tool never runs
// for that call, even once it can.
func TestACallWhoseToolCannotRunIsRefusedAndTheRefusalRecorded(t *testing.T) {
	tests := []struct {
		name   string
		tool   string
		args   string
		broken func(f *remoteFixture) // makes the call unrunnable
		code   schemas.Code
	}{
		{"a tool that disappeared", "svc.gone", `{"n":1}`, func(f *remoteFixture) { f.provider.Set() }, schemas.CodeToolNotFound},
		{"arguments its schema refuses", "svc.typed", `{"n":"one"}`, func(*remoteFixture) {}, schemas.CodeArgsInvalid},
		{"a provider that cannot list its tools", "svc.listing", `{"n":1}`,
			func(f *remoteFixture) { f.provider.Fail(errors.New("discovery timed out")) }, schemas.CodeToolUnavailable},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tool := remoteTool(tc.tool, nil)
			f := newRemoteFixture(t, tool)
			tc.broken(f)
			turn := schemas.TurnID("cli", fmt.Sprintf("refused-%d", i))
			c := call(turn, 0, tc.tool, tc.args)
			res, err := f.eng.Execute(ctx(t), turnContext(turn), c, "a-1")
			if err != nil || res.Status != schemas.ResultFailed || res.Code != tc.code || !strings.Contains(res.Reason, tc.tool) || res.ApprovalID != "a-1" {
				t.Fatalf("Execute = %+v, %v; want failed %s naming the tool", res, err, tc.code)
			}
			if rec := claimResult(t, f.st, c.CallID); rec == nil || !same(rec, res) {
				t.Fatalf("claim holds %+v, want the refusal", rec)
			}
			// The tool is back (and the arguments would still be refused
			// by its schema: give it one that takes anything).
			f.provider.Fail(nil)
			again := remoteTool(tc.tool, nil)
			again.Desc.InputSchema = nil
			f.provider.Set(again)
			if res2, err := f.eng.Execute(ctx(t), turnContext(turn), c, "a-1"); err != nil || !same(res2, res) {
				t.Fatalf("Execute again = %+v, %v; want the recorded refusal", res2, err)
			}
			if n := tool.Total() + again.Total(); n != 0 {
				t.Fatalf("the tool ran %d times for a refused call", n)
			}
		})
	}
}

// A call whose result is recorded gets that result again, and is never
// sent again, even when its tool has disappeared since.
func TestARecordedResultOutlivesItsTool(t *testing.T) {
	tool := remoteTool("svc.once", nil)
	f := newRemoteFixture(t, tool)
	turn := schemas.TurnID("cli", "outlives")
	c := call(turn, 0, "svc.once", `{"n":1}`)
	first, err := f.eng.Execute(ctx(t), turnContext(turn), c, "")
	if err != nil || first.Status != schemas.ResultOK {
		t.Fatalf("first Execute = %+v, %v", first, err)
	}
	f.provider.Set()
	again, err := f.eng.Execute(ctx(t), turnContext(turn), c, "")
	if err != nil || !same(again, first) {
		t.Fatalf("Execute after the tool disappeared = %+v, %v; want the recorded result %+v", again, err, first)
	}
	if n := tool.Runs(c.CallID); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
}

// How a remote tool's failure becomes the call's result: uncertain is
// needs_attention, unavailable is failed, anything else is an error; each
// recorded, and the tool not run again.
func TestRemoteToolFailures(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status schemas.ResultStatus
		code   schemas.Code
	}{
		{"no reply in time", fmt.Errorf("request timed out: %w", tools.ErrUncertain), schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain},
		{"a reply that cannot be trusted", fmt.Errorf("%w: %w", tools.ErrUncertain, schemas.Errorf(schemas.CodeToolReplyInvalid, "reply for call t-x-0")),
			schemas.ResultNeedsAttention, schemas.CodeToolReplyInvalid},
		{"nobody listening", fmt.Errorf("no responders: %w", tools.ErrUnavailable), schemas.ResultFailed, schemas.CodeToolUnavailable},
		{"the tool ran and failed", errors.New("refund declined"), schemas.ResultError, schemas.CodeToolFailed},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tool := remoteTool("svc.fails", func(tools.Call) error { return tc.err })
			f := newRemoteFixture(t, tool)
			turn := schemas.TurnID("cli", fmt.Sprintf("remote-fail-%d", i))
			c := call(turn, 0, "svc.fails", `{}`)
			for range 2 {
				res, err := f.eng.Execute(ctx(t), turnContext(turn), c, "")
				if err != nil || res.Status != tc.status || res.Code != tc.code || !strings.Contains(res.Reason, schemas.ReasonOf(tc.err)) {
					t.Fatalf("Execute = %+v, %v; want %s %s with the tool's reason", res, err, tc.status, tc.code)
				}
				if strings.Contains(res.Reason, string(res.Code)+":") {
					t.Fatalf("reason %q repeats the result's code %s", res.Reason, res.Code)
				}
			}
			if rec := claimResult(t, f.st, c.CallID); rec == nil || rec.Code != tc.code {
				t.Fatalf("claim holds %+v, want the %s result", rec, tc.code)
			}
			if n := tool.Runs(c.CallID); n != 1 {
				t.Fatalf("the tool ran %d times, want 1", n)
			}
		})
	}
}

// An uncertain outcome of a retry-safe tool is not reported: the call is
// left claimed without a result, like one whose worker died, and runs
// again (once) after the claim lease.
func TestAnUncertainRetrySafeCallRunsAgainAfterTheLease(t *testing.T) {
	calls := 0
	tool := remoteTool("svc.idempotent", func(tools.Call) error {
		calls++
		if calls == 1 {
			return fmt.Errorf("reply lost: %w", tools.ErrUncertain)
		}
		return nil
	})
	tool.Safe = true
	f := newRemoteFixture(t, tool)
	turn := schemas.TurnID("cli", "uncertain-safe")
	tc, c := turnContext(turn), call(turn, 0, "svc.idempotent", `{"n":2}`)

	if res, err := f.eng.Execute(ctx(t), tc, c, ""); !errors.Is(err, batch.ErrClaimHeld) {
		t.Fatalf("Execute = %+v, %v; want ErrClaimHeld", res, err)
	}
	if rec := claimResult(t, f.st, c.CallID); rec != nil {
		t.Fatalf("claim holds %+v, want no result yet", rec)
	}
	if res, err := f.eng.Execute(ctx(t), tc, c, ""); !errors.Is(err, batch.ErrClaimHeld) || tool.Runs(c.CallID) != 1 {
		t.Fatalf("Execute within the lease = %+v, %v after %d runs; want ErrClaimHeld and no second run", res, err, tool.Runs(c.CallID))
	}
	f.clock.Advance(lease + time.Second)
	res, err := f.eng.Execute(ctx(t), tc, c, "")
	if err != nil || res.Status != schemas.ResultOK || tool.Runs(c.CallID) != 2 {
		t.Fatalf("Execute after the lease = %+v, %v after %d runs; want ok from a second run", res, err, tool.Runs(c.CallID))
	}
	if res, err := f.eng.Execute(ctx(t), tc, c, ""); err != nil || res.Status != schemas.ResultOK || tool.Runs(c.CallID) != 2 {
		t.Fatalf("Execute once recorded = %+v, %v after %d runs; want the recorded result", res, err, tool.Runs(c.CallID))
	}
}
