package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// TestTurnEventsResumeAfterADisconnect: a client reads a turn's first
// events, disconnects, the approval is decided meanwhile, and it
// reconnects with Last-Event-ID: together the two connections saw every
// event the stream holds for the turn, in order, none twice.
func TestTurnEventsResumeAfterADisconnect(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub, c := g.submitGated("a", "s-sse", "alice")

	var seen []sseEvent
	first := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")
	for {
		ev := first.nextEvent(t, 10*time.Second)
		seen = append(seen, ev)
		if ev.kind == "approval.requested" {
			break
		}
	}
	first.close()

	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	want[DecisionResponse](t, resp, body, 200)
	g.WaitOutcome(sub.TurnID)

	again := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a", "Last-Event-ID", seen[len(seen)-1].id)
	for {
		ev := again.nextEvent(t, 10*time.Second)
		seen = append(seen, ev)
		if ev.kind == "turn.outcome" {
			break
		}
	}
	// The events stored for the turn, in order: its request, which its
	// turn log's awaiting event keeps (a published copy is passed over),
	// then its decision, which its approval's record keeps, and those of
	// TOLLGATE_EVENTS, then its outcome, which only its turn log's outcome
	// event keeps (none is published); and the same as one stream from the
	// first gives (an id is a position in the stream that sent it, so
	// events are compared by kind and data).
	if n := len(g.PublishedOutcomes(sub.TurnID)); n != 0 {
		t.Fatalf("turn %s has %d published outcomes, want none: its log keeps it", sub.TurnID, n)
	}
	request, _, ok := g.loggedRequest(sub.TurnID, c.ApprovalID)
	if !ok {
		t.Fatalf("turn %s's log keeps no request of %s", sub.TurnID, c.ApprovalID)
	}
	// Its decision is its approval's revision in the approvals bucket
	// (its published copy passed over); the other events of TOLLGATE_EVENTS
	// come in their order, the two streams' in the order they were stored.
	decision, _, ok := g.decision(c.ApprovalID)
	if !ok {
		t.Fatalf("the bucket holds no decision of %s", c.ApprovalID)
	}
	mid := []placed{decision}
	for _, m := range g.Events("tollgate.event.*.*." + sub.TurnID) {
		if strings.HasPrefix(m.Subject, topology.SubjectApprovalRequested) {
			continue // its log keeps it
		}
		if d, err := schemas.Decode[schemas.DecidedEvent](m.Data); err == nil && d.Repeat == "" && d.ApprovalID == c.ApprovalID {
			continue // a copy of the bucket's revision
		}
		mid = append(mid, placed{src: 0, seq: m.Seq, kind: turnEventKind(m.Subject)})
	}
	slices.SortStableFunc(mid, func(a, b placed) int { return g.stored(a).Time.Compare(g.stored(b).Time) })
	wantKinds, wantKeys := []string{"approval.requested"}, []placed{request}
	for _, pl := range mid {
		wantKinds, wantKeys = append(wantKinds, pl.kind), append(wantKeys, pl)
	}
	var gotKinds []string
	wantKinds = append(wantKinds, "turn.outcome")
	wantKeys = append(wantKeys, placed{src: 1 + topology.TurnLogPartition(sub.TurnID, g.partitions()), seq: g.OutcomeEvent(sub.TurnID).Seq})
	for i, ev := range seen {
		gotKinds = append(gotKinds, ev.kind)
		var payload map[string]any
		if err := json.Unmarshal([]byte(ev.data), &payload); err != nil || payload["turn_id"] != sub.TurnID {
			t.Errorf("event %s %s: data %s", ev.id, ev.kind, ev.data)
		}
		if _, err := eventfeed.ParseCursor(ev.id); err != nil || strings.Count(ev.id, ".") != 5 {
			t.Errorf("event %d's id %q is not a cursor of the events stream, 4 turn logs and the approvals: %v", i, ev.id, err)
		}
	}
	if !slices.Equal(gotKinds, wantKinds) {
		t.Fatalf("events seen %v, stored %v", gotKinds, wantKinds)
	}
	// Each event is the stored message it stands for, in the stored order.
	placedSeen := g.place(seen)
	checkOrder(t, placedSeen)
	for i := range placedSeen {
		if placedSeen[i].src != wantKeys[i].src || placedSeen[i].seq != wantKeys[i].seq {
			t.Fatalf("events seen %v, stored %v", placedSeen, wantKeys)
		}
	}
	whole := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")
	for i := range seen {
		ev := whole.nextEvent(t, 10*time.Second)
		if ev.kind != seen[i].kind || ev.data != seen[i].data {
			t.Fatalf("event %d from the first: %s %s, resumed: %s %s", i, ev.kind, ev.data, seen[i].kind, seen[i].data)
		}
	}
	kinds := map[string]bool{}
	for _, ev := range seen {
		kinds[ev.kind] = true
	}
	for _, k := range []string{"approval.requested", "approval.decided", "turn.outcome"} {
		if !kinds[k] {
			t.Errorf("no %s event among %v", k, seen)
		}
	}
	// A turn of this version waits and starts in its turn's log alone
	// (issue 36): no batch.awaiting, no redrive.started.
	for _, k := range []string{"batch.awaiting", "redrive.started"} {
		if kinds[k] {
			t.Errorf("a %s event among %v", k, seen)
		}
	}
}

// TestSessionEventsAndHeartbeats: /v1/events?session= streams the new
// events of the session's turns of the key's transport only (another
// transport's turn in a session of the same id is not shown), with
// heartbeat comments.
func TestSessionEventsAndHeartbeats(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.Heartbeat = 100 * time.Millisecond })
	stream := g.openSSE("/v1/events?session=s-shared", "a")
	for ev := stream.next(t, 5*time.Second); ev.data != "heartbeat"; ev = stream.next(t, 5*time.Second) {
	}
	mine := g.submit("a", submitBody("s-shared", "alice", call("echo", `{"text":"1"}`)))
	theirs := g.submit("b", submitBody("s-shared", "bob", call("echo", `{"text":"2"}`)))
	g.WaitOutcome(theirs.TurnID)
	last := g.submit("a", submitBody("s-shared", "alice", call("echo", `{"text":"3"}`)))
	turns := map[string]bool{}
	for {
		ev := stream.nextEvent(t, 10*time.Second)
		var p struct {
			TurnID string `json:"turn_id"`
		}
		if err := json.Unmarshal([]byte(ev.data), &p); err != nil {
			t.Fatal(err)
		}
		turns[p.TurnID] = true
		if ev.kind == "turn.outcome" && p.TurnID == last.TurnID {
			break
		}
	}
	if !turns[mine.TurnID] || turns[theirs.TurnID] {
		t.Fatalf("turns seen %v: want %s, not %s (transport other)", turns, mine.TurnID, theirs.TurnID)
	}
	// The other transport's turn did end (its outcome is in its turn log,
	// and not published): the stream left it out.
	if n := len(g.Outcomes(theirs.TurnID)); n != 1 {
		t.Fatalf("the other transport's turn has %d outcomes, want 1", n)
	}
	if n := len(g.PublishedOutcomes(theirs.TurnID)); n != 0 {
		t.Fatalf("the other transport's turn has %d published outcomes, want none: its log keeps it", n)
	}
}

// A stream whose filter drops every event of a busy feed still gets its
// heartbeats (and so keeps its connection deadlines held): the heartbeat
// waits for the last write, not for the last event the feed delivered.
func TestAFilteredStreamOfABusyFeedStillGetsHeartbeats(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.Heartbeat = 300 * time.Millisecond })
	stream := g.openSSE("/v1/events?session=quiet", "a")
	for ev := stream.next(t, 5*time.Second); ev.data != "heartbeat"; ev = stream.next(t, 5*time.Second) {
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() { // another session's events, every 30 ms: faster than the heartbeat
		defer close(done)
		tick := time.NewTicker(30 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				_, _ = g.JS.Publish(context.Background(), topology.EventSubject(topology.SubjectTurnOutcome, fmt.Sprintf("t-busy%d", i)), []byte("not for this stream"))
			}
		}
	}()
	if ev := stream.next(t, 3*time.Second); ev.kind != ":" || ev.data != "heartbeat" {
		t.Fatalf("got %+v, want a heartbeat while every event is filtered out", ev)
	}
}

// TestTurnEventsEndAfterTheOutcome: a turn's event stream ends after the
// turn's outcome, also when opened after the turn finished (curl -N
// returns), while a session's stream goes on.
func TestTurnEventsEndAfterTheOutcome(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub, c := g.submitGated("a", "s-sse-end", "alice")
	live := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")
	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	want[DecisionResponse](t, resp, body, 200)
	for _, stream := range []*sseReader{live, g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")} {
		for ev := stream.nextEvent(t, 10*time.Second); ev.kind != "turn.outcome"; ev = stream.nextEvent(t, 10*time.Second) {
		}
		select {
		case line, ok := <-stream.lines:
			for ok {
				if strings.HasPrefix(line, "event: ") {
					t.Fatalf("an event after the outcome: %q", line)
				}
				line, ok = <-stream.lines
			}
		case <-jstest.After(jstest.Wait):
			t.Fatal("the turn's stream did not end after its outcome")
		}
	}
}
