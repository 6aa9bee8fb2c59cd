package batch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// otherEngine is a second engine on f's store and tools: another process.
func otherEngine(t testing.TB, f *fixture, worker string) *batch.Engine {
	t.Helper()
	reg, err := tools.NewCatalog(t.Context(), []tools.Tool{f.count, f.fail, f.safe}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := batch.New(batch.Config{JS: f.env.JS, Store: f.st, Tools: reg, Keys: pt.Keys(t), Worker: worker, Logger: pt.Logger(),
		ClaimLease: lease, ToolTimeout: time.Second, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// running writes batch turn in state running with calls, as the executor's
// move to running does, claiming call first for eng (-1: none), and
// returns what it wrote.
func running(t testing.TB, f *fixture, eng *batch.Engine, turn string, first int, calls ...schemas.ToolCall) batch.Known {
	t.Helper()
	newBatch(t, f, turn, schemas.BatchQueued, calls...)
	b, rev, err := f.st.Batches.Mutate(ctx(t), turn, func(b *schemas.BatchRecord) error {
		b.State = schemas.BatchRunning
		if first >= 0 {
			eng.Claim(b, first)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return batch.Known{Batch: b, BatchRev: rev}
}

func stored(t testing.TB, f *fixture, turn string) (*schemas.BatchRecord, uint64) {
	t.Helper()
	b, rev, err := f.st.Batches.Get(ctx(t), turn)
	if err != nil {
		t.Fatal(err)
	}
	return b, rev
}

// A run's calls are claimed in the batch record, at most one write each:
// the first rides on the move to running, the next one's claim carries
// the first one's result, and the stage's last write carries the rest. No
// claim record is written.
func TestARunClaimsInTheBatchRecordOneWriteACall(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "inline")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	k := running(t, f, f.eng, turn, 0, c0, c1)

	run := f.eng.NewRun(k, nil, false)
	if err := run.Execute(ctx(t), 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, rev := stored(t, f, turn); rev != k.BatchRev {
		t.Fatalf("revision %d after call 0, want %d: its claim rode on the move to running", rev, k.BatchRev)
	}
	if err := run.Execute(ctx(t), 1, "a-1"); err != nil {
		t.Fatal(err)
	}
	b, rev := stored(t, f, turn)
	if rev != k.BatchRev+1 {
		t.Fatalf("revision %d after call 1, want %d: one write, call 1's claim", rev, k.BatchRev+1)
	}
	if b.ClaimOf(0) == nil || b.ClaimOf(1) == nil || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK || b.Results[1] != nil {
		t.Fatalf("record after call 1: claims %v %v, results %+v; want both claimed, call 0's result carried by call 1's claim", b.ClaimOf(0), b.ClaimOf(1), b.Results)
	}
	res := run.Results()
	if res[0] == nil || res[1] == nil || res[1].Status != schemas.ResultOK || res[1].ApprovalID != "a-1" {
		t.Fatalf("run results %+v", res)
	}
	end, err := f.eng.ConcludeFrom(ctx(t), turn, run.Known(), res, "", "")
	if err != nil || end.State != schemas.BatchCompleted || end.Results[1] == nil {
		t.Fatalf("conclude: %+v %v", end, err)
	}
	if n := f.count.Runs(c0.CallID) + f.count.Runs(c1.CallID); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
	for _, c := range []schemas.ToolCall{c0, c1} {
		if _, _, err := f.st.Claims.Get(ctx(t), c.CallID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("claim record of %s: %v, want none", c.CallID, err)
		}
	}
	// Asked again (a redelivery), the same results and no run.
	again := f.eng.NewRun(batch.Known{Batch: end, BatchRev: 0}, nil, true)
	if err := again.Execute(ctx(t), 1, "a-1"); err != nil || !same(again.Results()[1], end.Results[1]) {
		t.Fatalf("again: %+v %v", again.Results()[1], err)
	}
	if n := f.count.Total(); n != 2 {
		t.Fatalf("%d runs after a repeat, want 2", n)
	}
}

// Workers of several processes (and goroutines of one) on the same
// running batch: the call runs once; every other attempt is told the
// claim is held, or finds the result.
func TestConcurrentRunsRunACallOnce(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "race")
	c0 := call(turn, 0, "count", `{}`)
	k := running(t, f, f.eng, turn, -1, c0)
	engines := []*batch.Engine{f.eng, otherEngine(t, f, "test@2"), otherEngine(t, f, "test@3")}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran, held := 0, 0
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := engines[i%len(engines)].NewRun(batch.Known{Batch: k.Batch, BatchRev: k.BatchRev}, nil, false)
			err := run.Execute(ctx(t), 0, "")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, batch.ErrClaimHeld):
				held++
			case err != nil:
				t.Errorf("execute: %v", err)
			case run.Results()[0] == nil:
				t.Error("no result and no error")
			default:
				ran++
			}
		}()
	}
	wg.Wait()
	if n := f.count.Runs(c0.CallID); n != 1 {
		t.Fatalf("tool ran %d times, want once", n)
	}
	if ran < 1 || ran+held != 12 {
		t.Fatalf("%d with a result, %d held", ran, held)
	}
}

// A claim without a result (its worker died between the claim and the
// next write) is held for the lease, then reported uncertain and never run
// again; a retry-safe tool's is taken over and run again, once.
func TestARunHonoursAClaimWithoutResult(t *testing.T) {
	f := newFixture(t)
	dead := otherEngine(t, f, "crashed@2")
	for i, tc := range []struct {
		name string
		tool string
		age  time.Duration
		want string // held, uncertain, reran
	}{
		{"a claim younger than the lease is held", "count", lease - time.Second, "held"},
		{"a claim at the lease is uncertain", "count", lease, "uncertain"},
		{"a claim older than the lease is uncertain", "count", 3 * lease, "uncertain"},
		{"a retry-safe call's claim younger than the lease is held", "idempotent", time.Second, "held"},
		{"a retry-safe call's claim past the lease is taken over and run again", "idempotent", lease, "reran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn := schemas.TurnID("cli", fmt.Sprintf("orphan-inline%d", i))
			c := call(turn, 0, tc.tool, `{}`)
			now := f.clock.Now()
			f.clock.Set(now.Add(-tc.age))
			k := running(t, f, dead, turn, 0, c) // claimed by a worker that died
			f.clock.Set(now)

			run := f.eng.NewRun(k, nil, true)
			err := run.Execute(ctx(t), 0, "a-x")
			b, _ := stored(t, f, turn)
			runs := f.count.Runs(c.CallID) + f.safe.Runs(c.CallID)
			switch tc.want {
			case "held":
				if !errors.Is(err, batch.ErrClaimHeld) || run.Results()[0] != nil || runs != 0 {
					t.Fatalf("got %+v %v (%d runs), want ErrClaimHeld and no run", run.Results()[0], err, runs)
				}
			case "uncertain":
				r := run.Results()[0]
				if err != nil || r == nil || r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain || r.ApprovalID != "a-x" || runs != 0 {
					t.Fatalf("got %+v %v (%d runs), want needs_attention EXECUTION_UNCERTAIN and no run", r, err, runs)
				}
			case "reran":
				r := run.Results()[0]
				if err != nil || r == nil || r.Status != schemas.ResultOK || runs != 1 {
					t.Fatalf("got %+v %v (%d runs), want ok after one run", r, err, runs)
				}
				if c := b.ClaimOf(0); c == nil || c.Worker == "crashed@2" || !c.ClaimedAt.Equal(now) {
					t.Fatalf("claim %+v, want it taken over now by this engine", c)
				}
			}
		})
	}
}

// Calls that must not run fail without a claim: a context whose seal does
// not hold, arguments that do not match their digest, a tool the catalog
// does not have.
func TestARunFailsClosedWithoutClaiming(t *testing.T) {
	f := newFixture(t)
	for i, tc := range []struct {
		name string
		edit func(b *schemas.BatchRecord)
		code schemas.Code
	}{
		{"a tampered context", func(b *schemas.BatchRecord) { b.Context.Audience = schemas.AudiencePublic }, schemas.CodeTurnContextTampered},
		{"arguments unlike their digest", func(b *schemas.BatchRecord) { b.Calls[0].Args = `{"x":2}` }, schemas.CodeArgsDigestMismatch},
		{"a tool nobody has", func(b *schemas.BatchRecord) {
			b.Calls[0].Tool = "nope"
		}, schemas.CodeToolNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn := schemas.TurnID("cli", fmt.Sprintf("closed%d", i))
			k := running(t, f, f.eng, turn, -1, call(turn, 0, "count", `{"x":1}`))
			tc.edit(k.Batch)
			run := f.eng.NewRun(k, nil, false)
			err := run.Execute(ctx(t), 0, "")
			r := run.Results()[0]
			if err != nil || r == nil || r.Status != schemas.ResultFailed || r.Code != tc.code {
				t.Fatalf("got %+v %v, want failed %s", r, err, tc.code)
			}
			if b, rev := stored(t, f, turn); b.ClaimOf(0) != nil || rev != k.BatchRev {
				t.Fatalf("claim %+v at revision %d: a call that must not run was claimed", b.ClaimOf(0), rev)
			}
			if n := f.count.Total(); n != 0 {
				t.Fatalf("tool ran %d times", n)
			}
		})
	}
}

// The engine's own claim whose tool it has not started (its claim rode on
// a state write, or a write's acknowledgement was lost) is run by it, not
// held; another engine holds it.
func TestARunRunsItsOwnUnstartedClaim(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "own")
	c0 := call(turn, 0, "count", `{}`)
	k := running(t, f, f.eng, turn, 0, c0)
	other := otherEngine(t, f, "test@2").NewRun(k, nil, true)
	if err := other.Execute(ctx(t), 0, ""); !errors.Is(err, batch.ErrClaimHeld) {
		t.Fatalf("another engine: %v, want ErrClaimHeld", err)
	}
	run := f.eng.NewRun(k, nil, true)
	if err := run.Execute(ctx(t), 0, ""); err != nil || run.Results()[0] == nil {
		t.Fatalf("own claim: %+v %v", run.Results()[0], err)
	}
	// Once started, the engine does not run it again off the same claim.
	again := f.eng.NewRun(k, nil, true)
	if err := again.Execute(ctx(t), 0, ""); !errors.Is(err, batch.ErrClaimHeld) {
		t.Fatalf("own started claim again: %v, want ErrClaimHeld", err)
	}
	if n := f.count.Runs(c0.CallID); n != 1 {
		t.Fatalf("tool ran %d times, want once", n)
	}
}

// A batch ended while a run was on it (aborted) starts no call: the claim
// is a compare-and-set of the record, and finds it terminal. A failed
// batch reports a call claimed without a result as uncertain, not failed.
func TestARunStartsNothingOnAnEndedBatch(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "aborted")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	k := running(t, f, otherEngine(t, f, "crashed@2"), turn, 0, c0, c1)
	end, err := f.eng.End(ctx(t), turn, nil, schemas.CodeBatchRecordMissing, "gave up")
	if err != nil {
		t.Fatal(err)
	}
	if r := end.Results[0]; r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain {
		t.Fatalf("claimed call's result in the failed batch: %+v, want needs_attention EXECUTION_UNCERTAIN", r)
	}
	if r := end.Results[1]; r.Status != schemas.ResultFailed || r.Code != schemas.CodeBatchRecordMissing {
		t.Fatalf("unclaimed call's result: %+v, want failed with the code", r)
	}
	// A run from the record as it was before the end: the result the
	// record holds now is taken, nothing runs.
	run := f.eng.NewRun(k, nil, false)
	if err := run.Execute(ctx(t), 1, ""); !errors.Is(err, batch.ErrNotRunning) && (err != nil || !same(run.Results()[1], end.Results[1])) {
		t.Fatalf("execute on an ended batch: %+v %v", run.Results()[1], err)
	}
	if n := f.count.Total(); n != 0 {
		t.Fatalf("tool ran %d times on an ended batch", n)
	}
}

// A version 1 batch (written before the upgrade) keeps its claims in
// tollgate_claims: a claim made there before the upgrade is honoured, and
// the record is written back as version 1 without claims.
func TestARunOfALegacyBatchUsesTheClaimsBucket(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "legacy")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	newBatchAs(t, f, turn, schemas.BatchStarted, schemas.AsLegacyBatch, c0, c1)
	b, rev := stored(t, f, turn)
	if !b.Legacy() || !b.Bucketed() {
		t.Fatal("not read as a version 1 record of the bucket")
	}
	// The previous version ran call 0 and recorded its result in its claim.
	prior := f.eng.Result(c0, schemas.ResultOK, "", "", "")
	prior.Output = "ran before the upgrade"
	if _, err := f.st.Claims.Create(ctx(t), c0.CallID, &schemas.ExecutionClaim{CallID: c0.CallID, TurnID: turn, Tool: c0.Tool,
		ArgsDigest: c0.ArgsDigest, Worker: "old@1", ClaimedAt: f.clock.Now(), Result: prior}); err != nil {
		t.Fatal(err)
	}
	f.eng.Claim(b, 1) // a no-op on a version 1 record
	run := f.eng.NewRun(batch.Known{Batch: b, BatchRev: rev}, nil, true)
	for i := range 2 {
		if err := run.Execute(ctx(t), i, ""); err != nil {
			t.Fatal(err)
		}
	}
	if r := run.Results()[0]; r.Output != "ran before the upgrade" {
		t.Fatalf("call 0: %+v, want the result its claim recorded", r)
	}
	if n, m := f.count.Runs(c0.CallID), f.count.Runs(c1.CallID); n != 0 || m != 1 {
		t.Fatalf("runs %d and %d, want 0 and 1", n, m)
	}
	if c, _, err := f.st.Claims.Get(ctx(t), c1.CallID); err != nil || c.Result == nil {
		t.Fatalf("call 1's claim record: %+v %v, want one with its result", c, err)
	}
	end, err := f.eng.ConcludeFrom(ctx(t), turn, run.Known(), run.Results(), "", "")
	if err != nil || end.State != schemas.BatchCompleted {
		t.Fatalf("conclude: %+v %v", end, err)
	}
	if b, _ := stored(t, f, turn); !b.Legacy() || len(b.Claims) != 0 {
		t.Fatalf("written back as version %d with claims %v, want version 1 without", b.V, b.Claims)
	}
	noLog(t, f, turn)
}

// A version 2 batch that an earlier version kept in tollgate_batches
// (before the turn logs) runs there: its claims are in the record, its
// writes go back to the bucket, and its turn's log stays empty.
func TestARunOfABucketedBatchStaysInTheBucket(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "bucketed")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	newBatchAs(t, f, turn, schemas.BatchStarted, schemas.AsBucketedBatch, c0, c1)
	b, rev := stored(t, f, turn)
	if b.Legacy() || !b.Bucketed() {
		t.Fatal("not read as a version 2 record of the bucket")
	}
	run := f.eng.NewRun(batch.Known{Batch: b, BatchRev: rev}, nil, true)
	for i := range 2 {
		if err := run.Execute(ctx(t), i, ""); err != nil {
			t.Fatal(err)
		}
	}
	if n, m := f.count.Runs(c0.CallID), f.count.Runs(c1.CallID); n != 1 || m != 1 {
		t.Fatalf("runs %d and %d, want 1 and 1", n, m)
	}
	mid, _, err := f.st.Batches.Bucket.Get(ctx(t), turn)
	if err != nil || mid.ClaimOf(1) == nil || mid.Results[0] == nil {
		t.Fatalf("the bucket's record after the second claim: %+v %v, want call 1 claimed and call 0's result", mid, err)
	}
	if c, _, err := f.st.Claims.Get(ctx(t), c1.CallID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("claim record of a version 2 call: %+v %v, want none", c, err)
	}
	end, err := f.eng.ConcludeFrom(ctx(t), turn, run.Known(), run.Results(), "", "")
	if err != nil || end.State != schemas.BatchCompleted {
		t.Fatalf("conclude: %+v %v", end, err)
	}
	if b, _, err := f.st.Batches.Bucket.Get(ctx(t), turn); err != nil || b.State != schemas.BatchCompleted || b.Legacy() {
		t.Fatalf("the bucket's record: %+v %v, want it completed, version 2", b, err)
	}
	noLog(t, f, turn)
}

// noLog fails t when turn has an event in its log.
func noLog(t testing.TB, f *fixture, turn string) {
	t.Helper()
	if b, _, err := f.st.Batches.Log.Get(ctx(t), turn); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("turn %s's log: %+v %v, want no event", turn, b, err)
	}
}

// Once a tool has run, the write that carries its result is made even
// when the caller's context has ended (a stage stopping, a handler's
// deadline): the result is not left to become EXECUTION_UNCERTAIN. Before
// any tool ran, the caller's context rules.
func TestAResultIsCarriedPastTheCallersCancellation(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "carry")
	c0 := call(turn, 0, "count", `{}`)
	k := running(t, f, f.eng, turn, 0, c0)
	run := f.eng.NewRun(k, nil, false)
	cctx, cancel := context.WithCancel(ctx(t))
	if err := run.Execute(cctx, 0, ""); err != nil {
		t.Fatal(err)
	}
	cancel()
	err := run.Carry(cctx, func(ctx context.Context, k batch.Known) error {
		_, err := f.eng.ConcludeFrom(ctx, turn, k, run.Results(), "", "")
		return err
	})
	if err != nil {
		t.Fatalf("carry after the caller's cancellation: %v", err)
	}
	if b, _ := stored(t, f, turn); b.State != schemas.BatchCompleted || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("batch %s results %+v, want completed with the call's result", b.State, b.Results)
	}

	turn2 := schemas.TurnID("cli", "carry-none")
	k2 := running(t, f, f.eng, turn2, -1, call(turn2, 0, "count", `{}`))
	idle := f.eng.NewRun(k2, nil, false) // no tool ran
	err = idle.Carry(cctx, func(ctx context.Context, k batch.Known) error {
		_, err := f.eng.ConcludeFrom(ctx, turn2, k, idle.Results(), "", "")
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("carry with nothing run, on a cancelled context: %v, want context.Canceled", err)
	}
}

// A stage that gives a message back after a call ran (an error before its
// write that moves the batch on) keeps the call's result in the record:
// the message's next delivery finds it, and the call is neither run again
// nor reported uncertain. Keeping what the record holds already writes
// nothing.
func TestARunKeepsTheResultsOfCallsThatRanWhenItGivesUp(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "keep")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	k := running(t, f, f.eng, turn, 0, c0, c1)
	run := f.eng.NewRun(k, nil, false)
	if err := run.Execute(ctx(t), 0, ""); err != nil {
		t.Fatal(err)
	}
	giveUp := errors.New("a transient failure after the call ran")
	if err := run.KeepOnError(ctx(t), giveUp); !errors.Is(err, giveUp) {
		t.Fatalf("KeepOnError returned %v, want the stage's error", err)
	}
	b, rev := stored(t, f, turn)
	if b.State != schemas.BatchRunning || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK || b.Results[1] != nil {
		t.Fatalf("batch %s results %+v, want still running with call 0's result kept", b.State, b.Results)
	}
	if err := run.Keep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, again := stored(t, f, turn); again != rev {
		t.Fatalf("a second Keep wrote (revision %d, was %d)", again, rev)
	}
	// The next delivery, in another process: call 0 is done, call 1 runs.
	next := otherEngine(t, f, "test@2").NewRun(batch.Known{Batch: b, BatchRev: rev}, nil, true)
	for i := range 2 {
		if err := next.Execute(ctx(t), i, ""); err != nil {
			t.Fatal(err)
		}
	}
	if n, m := f.count.Runs(c0.CallID), f.count.Runs(c1.CallID); n != 1 || m != 1 {
		t.Fatalf("runs %d and %d, want each once", n, m)
	}
}

// An engine remembers the calls it started for one claim lease (plus the
// tool timeout) only: a long-running engine must not keep one entry per
// call it ever ran. Past the lease its own claim is judged like anyone's,
// so forgetting cannot make it run a call twice: a claim whose tool it
// started, and one it never started, are both reported uncertain.
func TestAnEngineForgetsTheCallsItStartedOnceTheirLeaseHasPassed(t *testing.T) {
	f := newFixture(t)
	turn := schemas.TurnID("cli", "forgets")
	c0, c1 := call(turn, 0, "count", `{}`), call(turn, 1, "count", `{"b":1}`)
	k := running(t, f, f.eng, turn, 0, c0, c1)
	run := f.eng.NewRun(k, nil, true)
	if err := run.Execute(ctx(t), 0, ""); err != nil || run.Results()[0] == nil || run.Results()[0].Status != schemas.ResultOK {
		t.Fatalf("own claim: %+v %v", run.Results()[0], err)
	}
	if n := f.eng.Started(); n != 1 {
		t.Fatalf("the engine remembers %d started calls, want 1", n)
	}

	// Within the lease nothing is forgotten, however many calls start.
	for i := range batch.PruneEvery {
		f.eng.MarkStarted(fmt.Sprintf("within-%d", i))
	}
	if n := f.eng.Started(); n != 1+batch.PruneEvery {
		t.Fatalf("within the lease the engine remembers %d started calls, want %d", n, 1+batch.PruneEvery)
	}
	// Past the lease and the tool timeout, the next sweep forgets them.
	f.clock.Advance(lease + 2*time.Second)
	for i := range batch.PruneEvery {
		f.eng.MarkStarted(fmt.Sprintf("later-%d", i))
	}
	if n := f.eng.Started(); n != batch.PruneEvery {
		t.Fatalf("past the lease the engine remembers %d started calls, want only the %d started since", n, batch.PruneEvery)
	}

	// Its own claims, from the record as it was before the result was
	// written (a run that died before its write), past the lease.
	for i, c := range []schemas.ToolCall{c0, c1} {
		b := k.Batch
		if i == 1 {
			b.SetClaim(1, &schemas.CallClaim{Worker: f.eng.Worker(), ClaimedAt: b.ClaimOf(0).ClaimedAt})
		}
		again := f.eng.NewRun(batch.Known{Batch: b, BatchRev: k.BatchRev}, nil, true)
		err := again.Execute(ctx(t), i, "")
		if r := again.Results()[i]; err != nil || r == nil || r.Code != schemas.CodeExecutionUncertain {
			t.Fatalf("call %d: own claim past the lease: %+v %v, want EXECUTION_UNCERTAIN", i, r, err)
		}
		if n := f.count.Runs(c.CallID); n != 1-i {
			t.Fatalf("call %d ran %d times, want %d", i, n, 1-i)
		}
	}
}
