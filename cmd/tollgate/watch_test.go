package main

import (
	"bufio"
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// watch follows the turn logs too: a batch's moves to awaiting and to
// started are stored nowhere else (no batch.awaiting notice, no
// redrive.started event: issue 36). Each move is one line, however many
// writes the batch makes in that state (a started batch's claims and
// results).
func TestWatchPrintsTheBatchMovesFromTheTurnLog(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	turn := h.Send(h.Inbound("s-watch", "alice",
		pt.Call("write_file", `{"path":"w1.txt","content":"1"}`), pt.Call("write_file", `{"path":"w2.txt","content":"2"}`)))
	h.WaitPending(schemas.ApprovalID(turn, 1))
	h.WaitState(turn, schemas.BatchAwaiting)
	h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
	h.Decide(schemas.ApprovalID(turn, 1), schemas.OptionApprove, "alice")
	h.WaitTerminal(turn)

	p := topology.TurnLogPartition(turn, len(h.Env.Buckets.TurnLogs))
	started := 0
	for _, m := range h.Messages(topology.TurnLogStream(p), topology.TurnLogWildcard(p, turn)) {
		if strings.HasSuffix(m.Subject, "."+string(schemas.BatchStarted)) {
			started++
		}
	}
	if started < 2 {
		t.Fatalf("the turn's log has %d started writes, want several (the move, then claims and results)", started)
	}

	// The decisions are the approvals bucket's revisions: the published
	// copy of the first is deleted, the second's kept. Each is shown
	// once, from the bucket.
	published := h.Events(topology.EventSubject(topology.SubjectApprovalDecided, turn))
	for _, m := range published {
		if ev, err := schemas.Decode[schemas.DecidedEvent](m.Data); err == nil && ev.ApprovalID == schemas.ApprovalID(turn, 0) {
			dctx, dcancel := h.Ctx()
			es, err := h.JS.Stream(dctx, topology.StreamEvents)
			if err == nil {
				err = es.DeleteMsg(dctx, m.Seq)
			}
			dcancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	r, w := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), pt.Wait)
	defer cancel()
	errR, errW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- runWatch(ctx, watchCmd, []string{url, "--all", "--turn", turn}, w, errW)
		w.Close()
		errW.Close()
	}()
	said, err := bufio.NewReader(errR).ReadString('\n')
	if err != nil || !strings.Contains(said, "the turn logs") || !strings.Contains(said, "the approvals bucket") {
		t.Fatalf("watch said %q (%v), want that it follows the turn logs and the approvals bucket", said, err)
	}
	go func() { _, _ = io.Copy(io.Discard, errR) }()

	var lines []string
	count := func(s string) int {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, s) {
				n++
			}
		}
		return n
	}
	sc := bufio.NewScanner(r)
	for (count("batch "+turn+" completed") == 0 || count(topology.SubjectTurnOutcome) == 0 || count(topology.SubjectApprovalDecided) < 2) && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	// Wait for a later fact, an event stored after the outcome was
	// published, then count the outcomes: the published copy is not shown
	// again (the log's outcome event is).
	marker := "tollgate.event.test.marker." + turn
	h.Publish(marker, "", &schemas.DecisionRejected{DecisionID: "d-marker", ApprovalID: schemas.ApprovalID(turn, 0), Code: schemas.CodeInvalidInput, Reason: "marker"})
	for count(marker) == 0 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, r) }()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{
		"batch " + turn + " running", "batch " + turn + " awaiting (2 approvals)",
		"batch " + turn + " started (approvals decided, calls free to run)", "batch " + turn + " completed (2 results)",
		topology.TurnLogSubject(p, turn, string(schemas.BatchStarted)),
		topology.EventSubject(topology.SubjectTurnOutcome, turn), "turn " + turn + " completed (2 results)", marker,
	} {
		if n := count(want); n != 1 {
			t.Errorf("watch printed %q %d times, want once:\n%s", want, n, all)
		}
	}
	if n := count(topology.EventSubject(topology.SubjectApprovalDecided, turn)); n != 2 {
		t.Errorf("watch printed %d decisions, want one per approval:\n%s", n, all)
	}
	// Each request once, after its batch's move to awaiting, which keeps
	// it (its published copy is not shown again); each decision once,
	// from the bucket, whether a published copy exists or not.
	for i := range 2 {
		id := schemas.ApprovalID(turn, i)
		if n := count("approval " + id + " approved by cli:alice"); n != 1 {
			t.Errorf("watch printed the decision of %s %d times, want once:\n%s", id, n, all)
		}
		if n := count("approval " + id + ": write_file"); n != 1 {
			t.Errorf("watch printed the request of %s %d times, want once:\n%s", id, n, all)
		}
		if slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "approval "+id+": write_file") }) <
			slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "batch "+turn+" awaiting") }) {
			t.Errorf("watch printed the request of %s before the move to awaiting:\n%s", id, all)
		}
	}
	if count(topology.SubjectBatchAwaiting) != 0 || count(topology.SubjectRedrive+string(schemas.RedriveStarted)) != 0 {
		t.Errorf("watch printed an awaiting notice or a redrive started event, which this version does not publish:\n%s", all)
	}
}

func TestWatchRefusesATurnThatIsNoTurnID(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{}})
	if code := runWatch(context.Background(), watchCmd, []string{"--nats=" + h.Env.URL(), "--turn", "t 1"}, io.Discard, io.Discard); code != 2 {
		t.Fatalf("exit %d, want 2 (usage)", code)
	}
}

func TestBatchSummary(t *testing.T) {
	for _, tc := range []struct {
		b    schemas.BatchRecord
		want string
	}{
		{schemas.BatchRecord{TurnID: "t-1", State: schemas.BatchAwaiting, Approvals: []string{"", "a-1-1"}}, "batch t-1 awaiting (1 approvals)"},
		{schemas.BatchRecord{TurnID: "t-1", State: schemas.BatchFailed, Results: make([]*schemas.ToolResult, 2),
			Code: schemas.CodeBatchStateInvalid, Reason: "bad\nstate"}, "batch t-1 failed (0 results) BATCH_STATE_INVALID: bad"},
	} {
		if got := batchSummary(&tc.b); !strings.HasPrefix(got, tc.want) {
			t.Errorf("batchSummary = %q, want %q...", got, tc.want)
		}
	}
}
