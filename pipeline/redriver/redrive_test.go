package redriver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const countPolicy = `{
  "version": "redrive-test",
  "tools": {
    "echo":       {"approval": "never"},
    "write_file": {"approval": "required"},
    "count":      {"approval": "required"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

func write(path string) schemas.ProposedCall {
	return pt.Call("write_file", fmt.Sprintf(`{"path":%q,"content":"c"}`, path))
}

func TestBatchBarrierDefersUntilEverySiblingIsDecided(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy})
	tests := []struct {
		name          string
		first, second string // options for approval 0, then approval 1
		files         []bool // whether a.txt and b.txt are written
	}{
		{"approve both", schemas.OptionApprove, schemas.OptionApprove, []bool{true, true}},
		{"approve one, deny the other", schemas.OptionApprove, schemas.OptionDeny, []bool{true, false}},
		{"deny first, then approve", schemas.OptionDeny, schemas.OptionApprove, []bool{false, true}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			dir := fmt.Sprintf("b%d/", i)
			turn := h.Send(h.Inbound(fmt.Sprintf("barrier%d", i), "alice", write(dir+"a.txt"), pt.Call("echo", `{"text":"e"}`), write(dir+"b.txt")))
			a0, a2 := schemas.ApprovalID(turn, 0), schemas.ApprovalID(turn, 2)
			h.WaitPending(a0)
			h.WaitPending(a2)

			h.Decide(a0, tc.first, "alice")
			var deferred *schemas.RedriveOutcome
			jstest.Eventually(t, pt.Wait, "deferred after the first decision", func() bool {
				for _, o := range h.Redrives("deferred", turn) {
					if o.Trigger == "decided:"+a0 {
						deferred = o
						return true
					}
				}
				return false
			})
			if deferred.Pending != 1 || deferred.Kind != schemas.RedriveDeferred || deferred.Code != "" {
				t.Fatalf("deferred outcome %+v, want 1 pending and no code", deferred)
			}
			if n := h.Starts(turn); n != 0 {
				t.Fatalf("%d started outcomes before the barrier", n)
			}
			if b := h.Batch(turn); b.State != schemas.BatchAwaiting || b.Results[0] != nil {
				t.Fatalf("batch %s results %v before the barrier", b.State, b.Results)
			}
			if files := h.SandboxFiles(); len(files) != 0 {
				t.Fatalf("files %v written before the barrier", files)
			}

			h.Decide(a2, tc.second, "alice")
			b, out := h.WaitTerminal(turn)
			h.WaitIdle(pt.Approver, pt.Redriver)
			if n := h.Starts(turn); n != 1 {
				t.Fatalf("%d started outcomes, want exactly 1", n)
			}
			// The move to started is the turn's log's event: no redrive
			// outcome is published for it.
			if st := h.Events(topology.SubjectRedrive + "started." + turn); len(st) != 0 {
				t.Fatalf("%d started redrive outcomes published, want none (the log's started event is the fact)", len(st))
			}
			if oc := h.Outcomes(turn); len(oc) != 1 {
				t.Fatalf("%d outcomes, want 1", len(oc))
			}
			if n := len(h.Redrives("failed", turn)); n != 0 {
				t.Fatalf("%d failed outcomes", n)
			}
			if b.State != schemas.BatchCompleted || out.State != schemas.TurnCompleted || len(out.Results) != 3 {
				t.Fatalf("batch %s outcome %+v", b.State, out)
			}
			for j, p := range []string{"a.txt", "b.txt"} {
				_, ok := h.File(dir + p)
				if ok != tc.files[j] {
					t.Fatalf("%s written=%v, want %v", p, ok, tc.files[j])
				}
				r := b.Results[2*j]
				want := schemas.ResultOK
				if !tc.files[j] {
					want = schemas.ResultDenied
				}
				if r.Status != want {
					t.Fatalf("result %d %+v, want %s", 2*j, r, want)
				}
			}
			for _, p := range []string{"a.txt", "b.txt"} {
				h.RemoveFile(dir + p)
			}
		})
	}
	started := h.Metric("tollgate_redrive_outcomes_total", map[string]string{"kind": "started"})
	deferred := h.Metric("tollgate_redrive_outcomes_total", map[string]string{"kind": "deferred"})
	stored := len(h.Redrives("deferred", "*"))
	if started != 3 || deferred != float64(stored) || stored < 3 {
		t.Fatalf("redrive metrics started=%v deferred=%v, want 3 and the %d deferred events stored", started, deferred, stored)
	}
}

// tamper describes a change made to KV behind the pipeline's back while a
// batch awaits its approval.
type tamper struct {
	name    string
	apply   func(h *pt.H, turn, approvalID string)
	decider string
	// Where the failure shows.
	rejected schemas.Code // the decision is rejected with this code ("" if applied)
	failed   schemas.Code // the batch then fails with this code
	// callOnly: the authority is intact and only the call is unusable, so
	// the batch completes with that call failed (and nothing run).
	callOnly bool
}

func TestRedriveFailsClosedOnTamperedAuthority(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy})
	tests := []tamper{
		{name: "the batch's TurnContext is removed", decider: "alice", failed: schemas.CodeTurnContextMissing,
			apply: func(h *pt.H, turn, _ string) {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context = nil })
			}},
		{name: "the batch's TurnContext names another requester", decider: "alice", failed: schemas.CodeTurnContextTampered,
			apply: func(h *pt.H, turn, _ string) {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.Requester.Principal = "cli:mallory" })
			}},
		{name: "the batch's TurnContext has an unknown version", decider: "alice", failed: schemas.CodeSchemaVersionUnsupported,
			apply: func(h *pt.H, turn, _ string) {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.V = 7 })
			}},
		{name: "the approval's audience is widened", decider: "alice", rejected: schemas.CodeTurnContextTampered, failed: schemas.CodeTurnContextMismatch,
			apply: func(h *pt.H, _, id string) {
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) { a.Context.Audience = schemas.AudiencePublic })
			}},
		{name: "the approval's requester is replaced and the impostor approves", decider: "mallory", rejected: schemas.CodeTurnContextTampered, failed: schemas.CodeTurnContextMismatch,
			apply: func(h *pt.H, _, id string) {
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) {
					a.Context.Requester.Principal, a.Context.Requester.SenderID = "cli:mallory", "mallory"
				})
			}},
		{name: "the approval's arguments are swapped with a matching digest", decider: "alice", failed: schemas.CodeTurnContextMismatch,
			apply: func(h *pt.H, _, id string) {
				h.MutateApproval(id, func(a *schemas.ApprovalRecord) {
					a.Args, a.ArgsDigest, _ = schemas.CanonicalArgs(`{"content":"evil","path":"evil.txt"}`)
				})
			}},
		{name: "the batch's call arguments are swapped", decider: "alice", failed: schemas.CodeArgsDigestMismatch, callOnly: true,
			apply: func(h *pt.H, turn, _ string) {
				h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Calls[0].Args = `{"content":"evil","path":"evil.txt"}` })
			}},
		{name: "the approval record is removed", decider: "alice", rejected: schemas.CodeApprovalNotFound, failed: schemas.CodeApprovalNotFound,
			apply: func(h *pt.H, _, id string) {
				ctx, cancel := h.Ctx()
				defer cancel()
				if err := h.Store.Approvals.KV.Delete(ctx, id); err != nil {
					h.T.Fatal(err)
				}
			}},
		{name: "the approval record has an unknown schema version", decider: "alice", rejected: schemas.CodeSchemaVersionUnsupported, failed: schemas.CodeSchemaVersionUnsupported,
			apply: func(h *pt.H, _, id string) { h.PutRaw(h.Store.Approvals.KV, id, withVersion(h, h.Approval(id), 9)) }},
		{name: "the approval record is rewritten as a version 1 record without its copied authority fields", decider: "alice", rejected: schemas.CodeLegacyContextIncomplete, failed: schemas.CodeLegacyContextIncomplete,
			apply: func(h *pt.H, _, id string) { h.PutRaw(h.Store.Approvals.KV, id, withVersion(h, h.Approval(id), 1)) }},
		{name: "the approval record is not msgpack", decider: "alice", rejected: schemas.CodeMalformed, failed: schemas.CodeMalformed,
			apply: func(h *pt.H, _, id string) { h.PutRaw(h.Store.Approvals.KV, id, []byte("{\"status\":\"approved\"}")) }},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn := h.Send(h.Inbound(fmt.Sprintf("tamper%d", i), "alice", write(fmt.Sprintf("t%d.txt", i))))
			id := schemas.ApprovalID(turn, 0)
			h.WaitPending(id)
			tc.apply(h, turn, id)

			d := h.Decide(id, schemas.OptionApprove, tc.decider)
			if tc.rejected != "" {
				if rej := h.WaitRejection(d); rej.Code != tc.rejected {
					t.Fatalf("decision rejected with %s, want %s", rej.Code, tc.rejected)
				}
				// Nothing was decided, so nothing triggers a redrive; a
				// recovery pass (a re-announced batch) must fail closed too.
				reannounce(h, turn)
			}
			b, out := h.WaitTerminal(turn)
			if r := b.Results[0]; r.Status != schemas.ResultFailed || r.Code != tc.failed {
				t.Fatalf("result %+v, want failed %s", r, tc.failed)
			}
			if files := h.SandboxFiles(); len(files) != 0 {
				t.Fatalf("tool ran under tampered authority: %v", files)
			}
			if tc.callOnly {
				if b.State != schemas.BatchCompleted || out.State != schemas.TurnCompleted {
					t.Fatalf("batch %s outcome %s, want completed with the call failed", b.State, out.State)
				}
				return
			}
			if b.State != schemas.BatchFailed || b.Code != tc.failed || out.State != schemas.TurnFailed || out.Code != tc.failed {
				t.Fatalf("batch %s %s, outcome %s %s; want failed %s", b.State, b.Code, out.State, out.Code, tc.failed)
			}
			fails := h.WaitRedrives("failed", turn, 1)
			if len(fails) != 1 || fails[0].Code != tc.failed {
				t.Fatalf("failed redrive outcomes %+v, want one with %s", fails, tc.failed)
			}
			// The code is a field of its own; the reason says it no more
			// (issue 25 row 16: "TURN_CONTEXT_TAMPERED: TURN_CONTEXT_TAMPERED: …").
			if strings.Contains(fails[0].Reason, string(tc.failed)) {
				t.Fatalf("failed redrive reason %q repeats its code %s", fails[0].Reason, tc.failed)
			}
			if n := h.Starts(turn); n != 0 {
				t.Fatalf("%d started outcomes for a batch whose authority was tampered with", n)
			}
		})
	}
}

func TestUndecodableBatchRecordIsNeverGuessed(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy})
	for i, tc := range []struct {
		name string
		raw  func(h *pt.H, b *schemas.BatchRecord) []byte
		code schemas.Code
	}{
		{"an unknown schema version", func(h *pt.H, b *schemas.BatchRecord) []byte { return withVersion(h, b, 3) }, schemas.CodeSchemaVersionUnsupported},
		{"bytes that are not msgpack", func(*pt.H, *schemas.BatchRecord) []byte { return []byte("not a record") }, schemas.CodeMalformed},
	} {
		// Where the record is: its turn's log, or the bucket where an
		// earlier version kept it.
		for j, bucketed := range []bool{false, true} {
			name := tc.name + " in its turn's log"
			if bucketed {
				name = tc.name + " in the bucket of an earlier version"
			}
			t.Run(name, func(t *testing.T) {
				h := h.For(t)
				turn := h.Send(h.Inbound(fmt.Sprintf("undecodable%d-%d", i, j), "alice", write(fmt.Sprintf("u%d-%d.txt", i, j))))
				id := schemas.ApprovalID(turn, 0)
				h.WaitPending(id)
				if bucketed {
					h.WaitState(turn, schemas.BatchAwaiting)
					h.MakeBucketed(turn)
				}
				h.PutRawBatch(turn, tc.raw(h, h.Batch(turn)))

				h.Decide(id, schemas.OptionApprove, "alice")
				// The decision cannot be acted on: its revision is
				// dead-lettered with the decoding code, and the tool never
				// runs.
				var dl pt.Stored
				jstest.Eventually(t, pt.Wait, "redriver dead letter", func() bool {
					for _, m := range h.DLQ(pt.Redriver) {
						if m.Subject == topology.DLQSubject(pt.Redriver) && m.Header.Get(runner.HeaderOriginalSubject) == topology.ApprovalRevisionSubject(id) {
							dl = m
							return true
						}
					}
					return false
				})
				if got := dl.Header.Get(runner.HeaderCode); got != string(tc.code) {
					t.Fatalf("dead letter code %s, want %s", got, tc.code)
				}
				if got := dl.Header.Get(runner.HeaderOriginalStream); got != topology.StreamApprovals {
					t.Fatalf("dead letter of stream %s, want %s", got, topology.StreamApprovals)
				}
				rec, err := schemas.Decode[schemas.ApprovalRecord](dl.Data)
				if err != nil || rec.ApprovalID != id || rec.Status != schemas.ApprovalApproved {
					t.Fatalf("dead letter body is not the decision's revision: %v %+v", err, rec)
				}
				if n := h.Starts(turn); n != 0 {
					t.Fatalf("%d started outcomes", n)
				}
				if files := h.SandboxFiles(); len(files) != 0 {
					t.Fatalf("tool ran on an undecodable batch: %v", files)
				}
			})
		}
	}
}

// A decision heard again (its record written again as it is, unmarked,
// as an earlier version's retire did; a decided event an earlier version
// published; an awaiting notice) runs the approved call no second time.
func TestADecisionHeardAgainRunsTheToolOnce(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("republish", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	h.Decide(id, schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)

	if awaiting := h.Events(topology.EventSubject(topology.SubjectBatchAwaiting, turn)); len(awaiting) != 0 {
		t.Fatalf("%d awaiting events stored; want none (the awaiting write is the turn's log's event)", len(awaiting))
	}
	rec := h.Approval(id)
	decided, err := schemas.Encode(schemas.DecidedOf(rec))
	if err != nil {
		t.Fatal(err)
	}
	// An awaiting notice as an earlier version published it, or as
	// tollgate replay nudges a batch: the redriver still takes it.
	notice, err := schemas.Encode(&schemas.TurnNotice{TurnID: turn, SessionID: b.SessionID, Kind: schemas.NoticeAwaiting, At: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		h.MutateApproval(id, func(*schemas.ApprovalRecord) {})
		h.PublishRaw(topology.EventSubject(topology.SubjectApprovalDecided, turn), h.NextID("again"), decided, nil)
		h.PublishRaw(topology.EventSubject(topology.SubjectBatchAwaiting, turn), h.NextID("again"), notice, nil)
	}
	h.WaitIdle(pt.Redriver)
	if n := count.Total(); n != 1 {
		t.Fatalf("tool ran %d times, want 1", n)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcome events, want 1", n)
	}
	if n := h.Starts(turn); n != 1 {
		t.Fatalf("%d started outcomes, want 1", n)
	}
	if after := h.Batch(turn); after.State != schemas.BatchCompleted || after.Results[0].FinishedAt != b.Results[0].FinishedAt {
		t.Fatalf("batch changed: %+v", after.Results[0])
	}
}

func TestConcurrentRedrivesStartOnceAndRunOnce(t *testing.T) {
	count := &pt.Counter{}
	// The redriver stage does not run: the test plays several redrivers.
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count},
		Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
	turn := h.Send(h.Inbound("racing-redrivers", "alice", pt.Call("count", `{"a":1}`), pt.Call("count", `{"a":2}`)))
	for i := range 2 {
		h.WaitPending(schemas.ApprovalID(turn, i))
	}
	for i := range 2 {
		h.Decide(schemas.ApprovalID(turn, i), schemas.OptionApprove, "alice")
		h.WaitApproval(schemas.ApprovalID(turn, i), "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
	}

	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := h.Ctx()
			defer cancel()
			for {
				err := h.Redriver.Redrive(ctx, turn, fmt.Sprintf("worker-%d", w))
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
			t.Fatal(err)
		}
	}
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted {
		t.Fatalf("batch %s", b.State)
	}
	for i := range 2 {
		if n := count.Runs(schemas.CallID(turn, i)); n != 1 {
			t.Fatalf("call %d ran %d times under %d concurrent redrivers", i, n, workers)
		}
	}
	if n := h.Starts(turn); n != 1 {
		t.Fatalf("%d started outcomes", n)
	}
}

func TestRedriveOfAnUnknownTurnFailsWithBatchRecordMissing(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy, Stages: []string{pt.Redriver}})
	turn := schemas.TurnID("cli", "never-accepted")
	h.PutApproval(decidedRecord(turn))
	fails := h.WaitRedrives("failed", turn, 1)
	if fails[0].Code != schemas.CodeBatchRecordMissing {
		t.Fatalf("code %s, want BATCH_RECORD_MISSING", fails[0].Code)
	}
	if got := h.Metric("tollgate_redrive_outcomes_total", map[string]string{"kind": "failed"}); got != 1 {
		t.Fatalf("failed outcomes metric %v", got)
	}
}

func TestMalformedRedriverInputIsDeadLettered(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy, Stages: []string{pt.Redriver}})
	tests := []struct {
		name    string
		subject string
		data    []byte
		code    schemas.Code
	}{
		{"garbage as an approval's revision", topology.ApprovalRevisionSubject("a-x-0"), []byte{0xc1}, schemas.CodeMalformed},
		{"an approval record of an unknown version", topology.ApprovalRevisionSubject("a-y-0"),
			rawWithV(t, map[string]any{"v": 5, "approval_id": "a-y-0", "turn_id": "t-y", "status": "approved"}), schemas.CodeSchemaVersionUnsupported},
		{"another approval's record under an approval's key", topology.ApprovalRevisionSubject("a-w-1"),
			encodedRecord(t, decidedRecord(schemas.TurnID("cli", "other-key"))), schemas.CodeMalformed},
		{"an awaiting notice naming an invalid key", topology.EventSubject(topology.SubjectBatchAwaiting, "t-z"),
			rawWithV(t, map[string]any{"v": 1, "turn_id": "t z", "kind": "awaiting"}), schemas.CodeInvalidInput},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			seq := h.PublishRaw(tc.subject, "", tc.data, nil)
			dls := h.WaitDLQ(pt.Redriver, i+1)
			dl := dls[len(dls)-1]
			if dl.Header.Get(runner.HeaderCode) != string(tc.code) || string(dl.Data) != string(tc.data) ||
				dl.Header.Get(runner.HeaderOriginalSeq) != fmt.Sprint(seq) {
				t.Fatalf("dead letter %v %q, want code %s with the original bytes of seq %d", dl.Header, dl.Data, tc.code, seq)
			}
		})
	}
	// No batch was touched by the dead letters: the turn the misplaced
	// record names has no failed redrive.
	if n := len(h.Redrives("failed", schemas.TurnID("cli", "other-key"))); n != 0 {
		t.Fatalf("%d failed redrives of the turn a misplaced record names; want none", n)
	}
	// The stage keeps working after the dead letters.
	turn := schemas.TurnID("cli", "after-dlq")
	h.Publish(topology.EventSubject(topology.SubjectBatchAwaiting, turn), "", &schemas.TurnNotice{TurnID: turn, SessionID: "s", Kind: schemas.NoticeAwaiting, At: time.Now()})
	h.WaitRedrives("failed", turn, 1)
}

// ----- helpers -----

// decidedRecord is an approved approval record of call 0 of turn, decided
// by alice.
func decidedRecord(turn string) *schemas.ApprovalRecord {
	now := time.Now().UTC()
	return &schemas.ApprovalRecord{V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: "s",
		CallID: schemas.CallID(turn, 0), Tool: "count", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`),
		Options: []string{schemas.OptionApprove, schemas.OptionDeny}, Status: schemas.ApprovalApproved, RequestedAt: now,
		Decision: &schemas.DecisionInfo{DecisionID: "d-1", Principal: "cli:alice", Option: schemas.OptionApprove, DecidedAt: now}}
}

func encodedRecord(t *testing.T, r schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withVersion encodes r, then rewrites its "v" field to v.
func withVersion(h *pt.H, r schemas.Record, v int) []byte {
	h.T.Helper()
	var m map[string]any
	if err := msgpack.Unmarshal(mustEncode(h, r), &m); err != nil {
		h.T.Fatal(err)
	}
	m["v"] = v
	b, err := msgpack.Marshal(m)
	if err != nil {
		h.T.Fatal(err)
	}
	return b
}

func rawWithV(t *testing.T, m map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustEncode(h *pt.H, r schemas.Record) []byte {
	h.T.Helper()
	b, err := schemas.Encode(r)
	if err != nil {
		h.T.Fatal(err)
	}
	return b
}

func TestACallWhoseWorkerDiedIsNeverRunTwice(t *testing.T) {
	const lease = 2 * time.Second
	tests := []struct {
		name   string
		age    time.Duration // of the orphaned claim when the decision arrives
		legacy bool          // a version 1 batch, its claim in tollgate_claims
	}{
		{"a claim older than the lease is reported uncertain at once", 10 * lease, false},
		{"a claim younger than the lease is waited out, then reported uncertain", 0, false},
		{"a version 1 batch's claim older than the lease is reported uncertain at once", 10 * lease, true},
		{"a version 1 batch's claim younger than the lease is waited out, then reported uncertain", 0, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			count := &pt.Counter{}
			// The approval is decided while no redriver runs; the redriver
			// that started the batch and claimed the call died.
			h0 := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
			turn := h0.Send(h0.Inbound(fmt.Sprintf("orphan%d", i), "alice", pt.Call("count", `{}`)))
			id := schemas.ApprovalID(turn, 0)
			h0.WaitPending(id)
			h0.WaitState(turn, schemas.BatchAwaiting)
			h0.Decide(id, schemas.OptionApprove, "alice")
			h0.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
			h0.WaitIdle(pt.Ingest, pt.Executor, pt.Approver)
			h0.Stop()
			ctx, cancel := h0.Ctx()
			defer cancel()
			if tc.legacy {
				h0.MakeLegacy(turn) // in the bucket, as version 1
			}
			b, rev, err := h0.Store.Batches.Get(ctx, turn)
			if err != nil {
				t.Fatal(err)
			}
			call := b.Calls[0]
			claimedAt := time.Now().UTC().Add(-tc.age)
			b.State = schemas.BatchStarted
			if tc.legacy {
				// As the previous version left it: the batch record (version
				// 1) started, the claim a record of tollgate_claims.
				if _, err := h0.Store.Batches.Update(ctx, turn, b, rev); err != nil {
					t.Fatal(err)
				}
				claim := &schemas.ExecutionClaim{CallID: call.CallID, TurnID: turn, Tool: call.Tool, ArgsDigest: call.ArgsDigest,
					Worker: "redriver@dead", ClaimedAt: claimedAt}
				if _, err := h0.Store.Claims.Create(ctx, call.CallID, claim); err != nil {
					t.Fatal(err)
				}
			} else {
				// The batch started, the call claimed by that write.
				b.SetClaim(0, &schemas.CallClaim{Worker: "redriver@dead", ClaimedAt: claimedAt})
				if _, err := h0.Store.Batches.Update(ctx, turn, b, rev); err != nil {
					t.Fatal(err)
				}
			}

			h := pt.Start(t, pt.Options{Env: h0.Env, Keys: h0.Keys, Policy: countPolicy, Tools: []tools.Tool{count}, ClaimLease: lease, ToolTimeout: lease / 2})
			b, out := h.WaitTerminal(turn)
			r := b.Results[0]
			if r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain || out.Results[0].Code != schemas.CodeExecutionUncertain {
				t.Fatalf("result %+v, want needs_attention EXECUTION_UNCERTAIN", r)
			}
			if n := count.Total(); n != 0 {
				t.Fatalf("tool ran %d times after its worker died mid-call", n)
			}
			if tc.age == 0 && h.Metric("tollgate_messages_retried_total", map[string]string{"stage": pt.Redriver}) == 0 {
				t.Fatalf("a held claim was not retried: result %+v", b.Results[0])
			}
			// The version 1 batch went through the compatibility path,
			// counted; a version 2 one never does.
			if n := h.Metric("tollgate_legacy_batch_runs_total", nil); (n > 0) != tc.legacy {
				t.Fatalf("%v legacy batch runs counted, want some exactly for a version 1 batch (%v)", n, tc.legacy)
			}
		})
	}
}

func TestResumesABatchWhoseRedriverDiedAfterStartingIt(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count},
		Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
	turn := h.Send(h.Inbound("resume", "alice", pt.Call("count", `{}`), pt.Call("count", `{"b":2}`)))
	for i := range 2 {
		h.WaitPending(schemas.ApprovalID(turn, i))
	}
	h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
	h.Decide(schemas.ApprovalID(turn, 1), schemas.OptionDeny, "alice")
	for i, want := range []schemas.ApprovalStatus{schemas.ApprovalApproved, schemas.ApprovalDenied} {
		h.WaitApproval(schemas.ApprovalID(turn, i), string(want), func(a *schemas.ApprovalRecord) bool { return a.Status == want })
	}
	// The crashed redriver had moved the batch to started and run nothing.
	h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchStarted })

	r := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, Env: h.Env, Stages: []string{pt.Redriver}})
	b, out := r.WaitTerminal(turn)
	r.WaitIdle(pt.Redriver)
	if b.State != schemas.BatchCompleted || out.State != schemas.TurnCompleted {
		t.Fatalf("batch %s outcome %s", b.State, out.State)
	}
	if b.Results[0].Status != schemas.ResultOK || b.Results[1].Status != schemas.ResultDenied {
		t.Fatalf("results %+v %+v", b.Results[0], b.Results[1])
	}
	if count.Runs(schemas.CallID(turn, 0)) != 1 || count.Total() != 1 {
		t.Fatalf("tool ran %d times, want once (the approved call)", count.Total())
	}
	if n := r.Starts(turn); n != 1 {
		t.Fatalf("%d started outcomes, want 1", n)
	}
}

func TestPendingApprovalSurvivesARestartOfEveryStage(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("restart", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	h.Stop()

	// The decision arrives while nothing runs, then every stage restarts.
	d := h.Decide(id, schemas.OptionApprove, "alice")
	r := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, Env: h.Env})
	b, _ := r.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK || b.Results[0].ApprovalID != id {
		t.Fatalf("batch %s result %+v", b.State, b.Results[0])
	}
	if a := r.Approval(id); a.Decision == nil || a.Decision.DecisionID != d.DecisionID {
		t.Fatalf("decision %+v", a.Decision)
	}
	if n := count.Total(); n != 1 {
		t.Fatalf("tool ran %d times", n)
	}
}

func TestRepeatedDecisionAfterTheDedupeWindowDoesNotRepeatTheOutcome(t *testing.T) {
	count := &pt.Counter{}
	// A short Nats-Msg-Id window, so the test can outlive it. It is set
	// before the stages start: nats-server 2.15 races (under -race) when a
	// stream update overlaps the stages creating their consumers.
	env := jstest.Start(t)
	cfg := topology.DefaultConfig()
	cfg.DuplicateWindow = 300 * time.Millisecond
	if err := topology.Ensure(jstest.Ctx(t), env.JS, cfg); err != nil {
		t.Fatal(err)
	}
	env.Topology = cfg // what the pipeline ensures again
	h := pt.Start(t, pt.Options{Env: env, Policy: countPolicy, Tools: []tools.Tool{count}})
	ctx, cancel := h.Ctx()
	defer cancel()

	turn := h.Send(h.Inbound("late-repeat", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	h.Decide(id, schemas.OptionApprove, "alice")
	h.WaitTerminal(turn)

	// Proof that the window has passed for everything published so far: a
	// probe stored after the outcome can be stored again.
	probe := h.NextID("probe")
	h.PublishRaw("tollgate.event.probe.x", probe, nil, nil)
	jstest.Eventually(t, pt.Wait, "dedupe window passed", func() bool {
		ack, err := h.JS.Publish(ctx, "tollgate.event.probe.x", nil, jetstream.WithMsgID(probe))
		return err == nil && !ack.Duplicate
	})

	// The requester clicks approve again, long after: an idempotent
	// success, and the transport is not told the outcome a second time.
	seq := h.Submit(h.Decision(id, schemas.OptionApprove, "cli", "alice"))
	h.WaitConsumed(pt.Approver, seq)
	h.WaitIdle(pt.Redriver)
	if n := len(h.Decisions(turn)); n != 1 {
		t.Fatalf("%d decisions, want the original", n)
	}
	if pub := h.Decided(turn); len(pub) != 1 || pub[0].Repeat == "" {
		t.Fatalf("published decided events %+v, want the repeat's answer", pub)
	}
	if rej := h.Rejections(id); len(rej) != 0 {
		t.Fatalf("repeat rejected: %+v", rej[0])
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcome events for one turn, want 1", n)
	}
	if n := count.Total(); n != 1 {
		t.Fatalf("tool ran %d times", n)
	}
}

// abortingTool ends its own batch while it runs, as a stage giving up on
// one of the batch's messages would.
type abortingTool struct{ abort func(turn string) }

func (abortingTool) Name() string { return "aborts" }
func (a abortingTool) Run(_ context.Context, c tools.Call) (string, error) {
	a.abort(c.Context.TurnID)
	return "done", nil
}

// A redrive that finds its batch ended under it (another stage aborted it
// while the redrive was running calls) starts no further approved call.
func TestRedriveStopsWhenItsBatchWasEndedUnderIt(t *testing.T) {
	count := &pt.Counter{}
	var h *pt.H
	aborts := abortingTool{abort: func(turn string) {
		if err := h.Engine.Abort(context.Background(), turn, schemas.CodeRetriesExhausted, "gave up"); err != nil {
			t.Errorf("abort: %v", err)
		}
	}}
	h = pt.Start(t, pt.Options{Policy: `{
	  "version": "aborts",
	  "tools": {"aborts": {"approval": "required"}, "count": {"approval": "required"}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`, Tools: []tools.Tool{count, aborts}})
	turn := h.Send(h.Inbound("ended-under", "alice", pt.Call("aborts", `{}`), pt.Call("count", `{}`)))
	for i := range 2 {
		h.WaitPending(schemas.ApprovalID(turn, i))
	}
	for i := range 2 {
		h.Decide(schemas.ApprovalID(turn, i), schemas.OptionApprove, "alice")
	}
	b, out := h.WaitTerminal(turn)
	if count.Total() != 0 {
		t.Fatalf("an approved call ran %d times after its batch was aborted", count.Total())
	}
	if b.State != schemas.BatchFailed || b.Code != schemas.CodeRetriesExhausted || out.State != schemas.TurnFailed {
		t.Fatalf("batch %s %s, outcome %s, want failed RETRIES_EXHAUSTED", b.State, b.Code, out.State)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
}

// A batch evaluated as ready to start, then written by someone else before
// the redriver's compare-and-set (here: its TurnContext tampered with in
// that window), is evaluated again from a fresh read; it is never moved to
// started on the strength of the older evaluation.
func TestABatchWrittenAfterItsEvaluationIsEvaluatedAgain(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy})
	turn := h.Send(h.Inbound("late-tamper", "alice", write("late.txt")))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	var once sync.Once
	redriver.SetBeforeStart(h.Redriver, func(got string) {
		if got != turn {
			return
		}
		once.Do(func() {
			h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.Context.Requester.Principal = "cli:mallory" })
		})
	})
	h.Decide(id, schemas.OptionApprove, "alice")
	b, out := h.WaitTerminal(turn)
	if b.State != schemas.BatchFailed || b.Code != schemas.CodeTurnContextTampered || out.Code != schemas.CodeTurnContextTampered {
		t.Fatalf("batch %s %s, outcome %s %s; want failed %s", b.State, b.Code, out.State, out.Code, schemas.CodeTurnContextTampered)
	}
	if files := h.SandboxFiles(); len(files) != 0 {
		t.Fatalf("tool ran under tampered authority: %v", files)
	}
	h.WaitIdle(pt.Redriver)
	if n := h.Starts(turn); n != 0 {
		t.Fatalf("%d started outcomes: the batch was moved to started on an evaluation of the record before the tampering", n)
	}
}

// A decision that reaches the redriver before its batch waits for it (the
// executor creates the approvals, then writes the batch awaiting) is held
// back, not acknowledged: it is retried until the batch waits, then starts
// the batch, once. Nothing else would: the executor announces nothing.
func TestADecisionBeforeTheBatchWaitsIsHeldUntilItWaits(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}})
	turn := h.Send(h.Inbound("early", "alice", pt.Call("count", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	h.WaitState(turn, schemas.BatchAwaiting)
	// As if the executor had not written the batch awaiting yet.
	h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchRunning })
	retried := func() float64 {
		return h.Metric("tollgate_messages_retried_total", map[string]string{"stage": pt.Redriver})
	}
	before := retried()
	h.Decide(id, schemas.OptionApprove, "alice")
	jstest.Eventually(t, pt.Wait, "the decided event retried while the batch runs", func() bool { return retried() >= before+2 })
	if b := h.Batch(turn); b.State != schemas.BatchRunning || count.Total() != 0 || h.Starts(turn) != 0 {
		t.Fatalf("batch %s, %d runs, %d starts while it had not waited yet; want it untouched", b.State, count.Total(), h.Starts(turn))
	}
	if n := len(h.Redrives("deferred", turn)); n != 0 {
		t.Fatalf("%d deferred outcomes for a held decision, want none", n)
	}
	// The executor's awaiting write lands.
	h.MutateBatch(turn, func(b *schemas.BatchRecord) { b.State = schemas.BatchAwaiting })
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("batch %s result %+v, want completed ok", b.State, b.Results[0])
	}
	if n, s := count.Total(), h.Starts(turn); n != 1 || s != 1 {
		t.Fatalf("%d runs and %d starts, want 1 and 1", n, s)
	}
	if n := len(h.Outcomes(turn)); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
}
