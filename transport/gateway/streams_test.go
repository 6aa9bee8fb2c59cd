package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// tryOpen opens an event stream as key; a stream (200) is returned open,
// any other answer with its body read. A stream the server never answers
// fails t after 10 s.
func (g *gw) tryOpen(path, key string, hdr ...string) (*http.Response, []byte) {
	g.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", g.url+path, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.tokens[key])
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	timer := time.AfterFunc(10*time.Second, cancel)
	defer timer.Stop()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		g.t.Fatalf("GET %s: %v", path, err)
	}
	g.t.Cleanup(func() { resp.Body.Close(); cancel() })
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// keyID is the id of key name.
func (g *gw) keyID(name string) string {
	id, _, _ := strings.Cut(strings.TrimPrefix(g.tokens[name], "tg_"), "_")
	return id
}

// consumers is how many consumers each stream the event feed reads has:
// TOLLGATE_EVENTS, then each turn log (where the turns' outcomes are),
// then the approvals bucket's (where the decisions are).
func (g *gw) consumers() []int {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	names := []string{topology.StreamEvents}
	for i := range g.partitions() {
		names = append(names, topology.TurnLogStream(i))
	}
	names = append(names, topology.StreamApprovals)
	var out []int
	for _, name := range names {
		st, err := g.JS.Stream(ctx, name)
		if err != nil {
			g.t.Fatal(err)
		}
		out = append(out, st.CachedInfo().State.Consumers)
	}
	return out
}

// One key holds at most MaxStreams event streams at once: one more is 429
// TOO_MANY_STREAMS, while another key, even of the same transport, still
// gets its stream; a stream closed frees its slot.
func TestEventStreamsPerKeyAreCapped(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.MaxStreams = 3 })
	// A turn waiting for its approval: its stream stays open (a turn's
	// stream ends after its outcome).
	sub, _ := g.submitGated("a", "s-cap", "alice")
	var open []*http.Response
	for i := range 3 {
		path := "/v1/events?session=s-cap"
		if i == 1 {
			path = "/v1/turns/" + sub.TurnID + "/events"
		}
		resp, body := g.tryOpen(path, "a")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d %s", i, resp.StatusCode, body)
		}
		open = append(open, resp)
	}
	for _, path := range []string{"/v1/events?session=s-cap", "/v1/turns/" + sub.TurnID + "/events"} {
		resp, body := g.tryOpen(path, "a")
		wantProblem(t, resp, body, http.StatusTooManyRequests, CodeTooManyStreams)
	}
	for _, key := range []string{"b", "a2"} {
		if resp, body := g.tryOpen("/v1/events?session=s-cap", key); resp.StatusCode != http.StatusOK {
			t.Fatalf("key %s, beside a key at its cap: %d %s", key, resp.StatusCode, body)
		}
	}
	open[0].Body.Close()
	jstest.Eventually(t, jstest.Wait, "a stream once one of the key's closed", func() bool {
		resp, _ := g.tryOpen("/v1/events?session=s-cap", "a")
		return resp.StatusCode == http.StatusOK
	})
}

// Streams opened and dropped (200 of them, turn streams read from the
// stream, session streams resumed after an event, new-events streams)
// leave TOLLGATE_EVENTS, each turn log (a turn's outcome is read there)
// and the approvals bucket's stream (its decisions) with the consumers it
// had plus the gateway's one: a read-only key cannot use up the streams'
// consumers.
func TestDroppedStreamsLeaveNoConsumers(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.Rate, c.Burst = 1000, 1000 })
	sub := g.submit("a", submitBody("s-drop", "alice", call("echo", `{"text":"1"}`)))
	g.WaitOutcome(sub.TurnID)
	first := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "readonly")
	id := first.nextEvent(t, 10*time.Second).id
	first.close()
	jstest.Eventually(t, jstest.Wait, "the first stream's slot freed", func() bool { return g.s.events.Open("gateway:"+g.keyID("readonly")) == 0 })
	before := g.consumers()
	paths := [][]string{
		{"/v1/turns/" + sub.TurnID + "/events"},
		{"/v1/events?session=s-drop", "Last-Event-ID", id},
		{"/v1/events?session=s-drop"},
	}
	for i := range 200 {
		p := paths[i%len(paths)]
		var resp *http.Response
		jstest.Eventually(t, jstest.Wait, "a slot for stream "+strconv.Itoa(i), func() bool {
			resp, _ = g.tryOpen(p[0], "readonly", p[1:]...)
			return resp.StatusCode == http.StatusOK
		})
		resp.Body.Close()
	}
	// The feed's consumer of each stream, and none per SSE stream: the
	// replay consumers are deleted as their streams catch up or end.
	jstest.EventuallyState(t, jstest.Wait, "the streams' consumers back to at most one more than before", func() (bool, string) {
		after := g.consumers()
		for i, n := range after {
			if n > before[i]+1 {
				return false, fmt.Sprintf("consumers of %s, the turn logs and %s %v, before %v", topology.StreamEvents, topology.StreamApprovals, after, before)
			}
		}
		return true, ""
	})
}

// A session stream resumed with Last-Event-ID delivers exactly the events
// of the session's turns stored after that id, none twice, in the order
// the feed promises (checkOrder): those stored while the client was
// away and those stored after it came back. Each event is the stored
// message it stands for: a turn's outcome its turn log's outcome event
// (none is published), a request its log's awaiting event, a decision
// its approval's revision in the approvals bucket (a published copy
// passed over), any other event TOLLGATE_EVENTS's.
func TestSessionStreamResumesExactlyAfterTheID(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.Heartbeat = 200 * time.Millisecond })
	// The first turn waits for an approval: its request is in its log's
	// awaiting event, its decision in the approvals bucket (and, while the
	// approver publishes it, an approval.decided in TOLLGATE_EVENTS); the
	// turns after it only have their outcomes, in their logs; the last
	// waits for an approval again, decided while the stream is open.
	approvals := map[string][]string{} // turn -> its approvals
	first, c := g.submitGated("a", "s-resume", "alice")
	approvals[first.TurnID] = []string{c.ApprovalID}
	g.approveCall(c)
	g.WaitOutcome(first.TurnID)
	turns := []string{first.TurnID}
	for i := range 2 {
		sub := g.submit("a", submitBody("s-resume", "alice", call("echo", `{"text":"`+strconv.Itoa(i)+`"}`)))
		g.WaitOutcome(sub.TurnID)
		turns = append(turns, sub.TurnID)
	}
	// An id of an earlier version (a bare TOLLGATE_EVENTS sequence: the
	// first turn's approval.decided, or where none is published, an event
	// stored after its outcome) resumes after that event, with the
	// requests, outcomes and decisions the turn logs and the bucket stored
	// since it was (the first turn's outcome included when it ended after
	// its approval.decided was published; not its decision: that was
	// stored before).
	var after uint64
	published := false
	switch decided := g.Events(topology.SubjectApprovalDecided + first.TurnID); len(decided) {
	case 0:
		ack, err := g.JS.Publish(jstest.Ctx(t), "tollgate.event.test.mark.t-none", []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		after = ack.Sequence
	case 1:
		after, published = decided[0].Seq, true
	default:
		t.Fatalf("%d approval.decided events of %s, want at most 1", len(decided), first.TurnID)
	}
	since := g.storedAt(after)
	stream := g.openSSE("/v1/events?session=s-resume", "a", "Last-Event-ID", strconv.FormatUint(after, 10))
	last, c := g.submitGated("a", "s-resume", "alice")
	approvals[last.TurnID] = []string{c.ApprovalID}
	g.approveCall(c)
	g.WaitOutcome(last.TurnID)
	turns = append(turns, last.TurnID)

	var wantKeys []placed
	parts := g.partitions()
	fromBucket := map[string]bool{} // an approval whose decision the stream has from the bucket
	for _, turn := range turns {
		if n := len(g.PublishedOutcomes(turn)); n != 0 {
			t.Fatalf("turn %s has %d published outcomes, want none: its log keeps it", turn, n)
		}
		if ev := g.OutcomeEvent(turn); !ev.Time.Before(since) {
			wantKeys = append(wantKeys, placed{src: 1 + topology.TurnLogPartition(turn, parts), seq: ev.Seq})
		}
		for _, id := range approvals[turn] {
			if pl, _, ok := g.loggedRequest(turn, id); !ok {
				t.Fatalf("turn %s's log keeps no request of %s", turn, id)
			} else if !g.stored(pl).Time.Before(since) {
				wantKeys = append(wantKeys, pl)
			}
			if pl, _, ok := g.decision(id); !ok {
				t.Fatalf("the bucket holds no decision of %s", id)
			} else if g.stored(pl).Time.After(since) {
				wantKeys, fromBucket[id] = append(wantKeys, pl), true
			}
		}
	}
	for _, m := range g.Events("tollgate.event.>") {
		if turn := turnOfEvent(m.Subject); m.Seq <= after || !slices.Contains(turns, turn) {
			continue
		}
		if d, err := schemas.Decode[schemas.DecidedEvent](m.Data); err == nil && d.Repeat == "" && fromBucket[d.ApprovalID] {
			continue // a copy: the bucket's revision stands for it
		}
		wantKeys = append(wantKeys, placed{src: 0, seq: m.Seq})
	}
	// Stored after the id: the last turn's request, decision and outcome;
	// after a published decision, the outcomes of the turns before too.
	if n, want := len(wantKeys), 3; n != want && (!published || n < len(turns)+1 || n > len(turns)+2) {
		t.Fatalf("%d events stored after %d, want the last turn's request, decision and outcome, and after a published decision the outcomes before: %v", n, after, wantKeys)
	}
	// read reads n events, then checks that the stream has no more: the
	// next thing it sends is a heartbeat.
	read := func(s *sseReader, n int) []placed {
		var evs []sseEvent
		for len(evs) < n {
			evs = append(evs, s.nextEvent(t, 10*time.Second))
		}
		if ev := s.next(t, 10*time.Second); ev.kind != ":" {
			t.Fatalf("an event after the %d wanted: %+v", n, ev)
		}
		return g.place(evs)
	}
	got := read(stream, len(wantKeys))
	checkOrder(t, got)
	if !sameEvents(got, wantKeys) {
		t.Fatalf("events after %d: got %v, want %v", after, got, wantKeys)
	}
	// The id of any event this version sent resumes exactly after it.
	for k := range got[:len(got)-1] {
		rest := read(g.openSSE("/v1/events?session=s-resume", "a", "Last-Event-ID", got[k].id.String()), len(got)-k-1)
		checkOrder(t, rest)
		if !sameEvents(rest, got[k+1:]) {
			t.Fatalf("events after %s: got %v, want %v", got[k].id, rest, got[k+1:])
		}
	}
}

// placed is an SSE event as the stored message it stands for: the stream
// the feed read it from (0: TOLLGATE_EVENTS; 1+p: turn-log partition p,
// whose outcome events keep the turns' outcomes and awaiting events their
// requests; 1+P, after the P partitions: KV_tollgate_approvals, whose
// revisions keep the approvals' decisions) and its sequence there, which
// is that stream's place in the event's id (the feed's position after the
// event; for a request that is not the last of its awaiting event,
// before it).
type placed struct {
	src        int
	seq        uint64
	kind, turn string
	id         eventfeed.Cursor
}

func (p placed) String() string { return fmt.Sprintf("%s %s (%d:%d)", p.kind, p.turn, p.src, p.seq) }

// partitions is how many turn-log partitions the pipeline has.
func (g *gw) partitions() int {
	g.t.Helper()
	logs, err := topology.OpenTurnLogs(jstest.Ctx(g.t), g.JS)
	if err != nil {
		g.t.Fatal(err)
	}
	return len(logs)
}

// storedAt is when TOLLGATE_EVENTS stored its message seq.
func (g *gw) storedAt(seq uint64) time.Time {
	g.t.Helper()
	return g.stored(placed{src: 0, seq: seq}).Time
}

// approveCall approves c's approval as alice, through the API.
func (g *gw) approveCall(c CallView) {
	g.t.Helper()
	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	want[DecisionResponse](g.t, resp, body, 200)
}

// stored is the message pl stands for, in its stream.
func (g *gw) stored(pl placed) *jetstream.RawStreamMsg {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	name := topology.StreamEvents
	switch parts := g.partitions(); {
	case pl.src == 1+parts:
		name = topology.StreamApprovals
	case pl.src > 0:
		name = topology.TurnLogStream(pl.src - 1)
	}
	st, err := g.JS.Stream(ctx, name)
	if err != nil {
		g.t.Fatal(err)
	}
	m, err := st.GetMsg(ctx, pl.seq)
	if err != nil {
		g.t.Fatalf("%s #%d: %v", name, pl.seq, err)
	}
	return m
}

// decision is where the approvals bucket keeps approval id's decision:
// its revision, as the feed hands it out (ok false: its latest revision
// is no decision).
func (g *gw) decision(id string) (pl placed, data []byte, ok bool) {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	st, err := g.JS.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		g.t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	if err != nil {
		return placed{}, nil, false
	}
	d, err := store.DecidedOf(m.Subject, m.Header, m.Data)
	if err != nil || d == nil {
		return placed{}, nil, false
	}
	if data, err = schemas.Encode(d); err != nil {
		g.t.Fatal(err)
	}
	return placed{src: 1 + g.partitions(), seq: m.Sequence, kind: "approval.decided", turn: d.TurnID}, data, true
}

// loggedRequest is where turn's log keeps the request of approval id:
// the partition and sequence of its awaiting event, and the request as
// the feed hands it out (ok false: the log keeps none).
func (g *gw) loggedRequest(turn, id string) (pl placed, data []byte, ok bool) {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	logs, err := topology.OpenTurnLogs(ctx, g.JS)
	if err != nil {
		g.t.Fatal(err)
	}
	seq, ok, err := store.LoggedRequest(ctx, logs, turn, id)
	if err != nil || !ok {
		return placed{}, nil, false
	}
	part := topology.TurnLogPartition(turn, len(logs))
	m, err := logs[part].GetMsg(ctx, seq)
	if err != nil {
		g.t.Fatalf("the awaiting event of %s: %s #%d: %v", turn, topology.TurnLogStream(part), seq, err)
	}
	reqs, err := store.DecodeRequested(turn, m.Data)
	if err != nil {
		g.t.Fatalf("the awaiting event of %s: %v", turn, err)
	}
	for _, a := range reqs {
		if a.ApprovalID == id {
			if data, err = schemas.Encode(a); err != nil {
				g.t.Fatal(err)
			}
		}
	}
	return placed{src: 1 + part, seq: seq, kind: "approval.requested", turn: turn}, data, true
}

// place finds the stored message each event stands for, and fails the
// test unless the event is that message as the gateway presents it: its
// kind and its data, a TOLLGATE_EVENTS event's as stored, a turn's
// outcome's as its turn log's outcome event keeps it (the outcome in the
// batch record; never a published copy), a request its turn's log keeps
// as its awaiting event keeps it (a published copy passed over), a
// decision (an approval.decided event without repeat) as the revision of
// its record in the approvals bucket keeps it (a published copy passed
// over; the bucket holds every decision these tests make).
func (g *gw) place(evs []sseEvent) []placed {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	events, err := g.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		g.t.Fatal(err)
	}
	logs, err := topology.OpenTurnLogs(ctx, g.JS)
	if err != nil {
		g.t.Fatal(err)
	}
	out := make([]placed, 0, len(evs))
	for _, ev := range evs {
		id, err := eventfeed.ParseCursor(ev.id)
		if err != nil || len(id) != 2+len(logs) {
			g.t.Fatalf("event %s %s: id %q is not a cursor of the events stream, %d turn logs and the approvals (%v)", ev.kind, ev.data, ev.id, len(logs), err)
		}
		var p struct {
			TurnID     string `json:"turn_id"`
			ApprovalID string `json:"approval_id"`
			Repeat     string `json:"repeat"`
		}
		if err := json.Unmarshal([]byte(ev.data), &p); err != nil || p.TurnID == "" {
			g.t.Fatalf("event %s %s: no turn_id (%v)", ev.kind, ev.data, err)
		}
		pl := placed{kind: ev.kind, turn: p.TurnID, id: id}
		var subject string
		var data []byte
		logged, request, inLog := placed{}, []byte(nil), false
		if ev.kind == "approval.requested" {
			logged, request, inLog = g.loggedRequest(pl.turn, p.ApprovalID)
		}
		switch {
		case inLog:
			pl.src, pl.seq = logged.src, logged.seq
			if id[pl.src] > pl.seq {
				g.t.Fatalf("event %s: id %s is past its awaiting event", pl, id)
			}
			subject, data = topology.EventSubject(topology.SubjectApprovalRequested, pl.turn), request
		case ev.kind == "approval.decided" && p.Repeat == "":
			pl.src = 1 + len(logs)
			pl.seq = id[pl.src]
			m := g.stored(pl)
			d, err := store.DecidedOf(m.Subject, m.Header, m.Data)
			if err != nil || d == nil || d.ApprovalID != p.ApprovalID {
				g.t.Fatalf("event %s: %s #%d is not the decision of %s: %+v, %v", pl, topology.StreamApprovals, pl.seq, p.ApprovalID, d, err)
			}
			if data, err = schemas.Encode(d); err != nil {
				g.t.Fatal(err)
			}
			subject = topology.EventSubject(topology.SubjectApprovalDecided, pl.turn)
		case ev.kind == "turn.outcome":
			part := topology.TurnLogPartition(pl.turn, len(logs))
			pl.src = 1 + part
			pl.seq = id[pl.src]
			m, err := logs[part].GetMsg(ctx, pl.seq)
			if err != nil {
				g.t.Fatalf("event %s: %s #%d: %v", pl, topology.TurnLogStream(part), pl.seq, err)
			}
			if want := topology.TurnLogSubject(part, pl.turn, store.EventOutcome); m.Subject != want {
				g.t.Fatalf("event %s: %s #%d is %s, want %s (the turn's outcome event)", pl, topology.TurnLogStream(part), pl.seq, m.Subject, want)
			}
			o, err := store.DecodeOutcome(pl.turn, m.Data)
			if err != nil {
				g.t.Fatalf("event %s: its outcome event: %v", pl, err)
			}
			if data, err = schemas.Encode(o); err != nil {
				g.t.Fatal(err)
			}
			subject = topology.EventSubject(topology.SubjectTurnOutcome, pl.turn)
		default:
			pl.seq = id[0]
			m, err := events.GetMsg(ctx, pl.seq)
			if err != nil {
				g.t.Fatalf("event %s: %s #%d: %v", pl, topology.StreamEvents, pl.seq, err)
			}
			subject, data = m.Subject, m.Data
		}
		stored, ok := decodeEvent(eventfeed.Event{Subject: subject, Data: data})
		if !ok {
			g.t.Fatalf("event %s: the stored %s does not decode", pl, subject)
		}
		j, err := json.Marshal(stored.payload)
		if err != nil {
			g.t.Fatal(err)
		}
		if stored.kind != ev.kind || turnOfEvent(subject) != pl.turn || string(j) != ev.data {
			g.t.Fatalf("event %s: %s %s, stored (%s) %s %s", pl, ev.kind, ev.data, subject, stored.kind, j)
		}
		out = append(out, pl)
	}
	return out
}

// checkOrder fails t unless evs come in the order the feed promises
// (docs/api.md): each stream's messages in their order there, none twice,
// and each turn's outcome after the turn's other events (the outcomes of
// turns in different partitions, and a turn's outcome and another turn's
// events, keep no order between them); and ids that never go back.
func checkOrder(t *testing.T, evs []placed) {
	t.Helper()
	lastSeq := map[int]uint64{}
	ended := map[string]bool{}
	for i, ev := range evs {
		if s, ok := lastSeq[ev.src]; ok && ev.seq <= s {
			t.Fatalf("event %d %s after #%d of its stream: %v", i, ev, s, evs)
		}
		lastSeq[ev.src] = ev.seq
		if ended[ev.turn] {
			t.Fatalf("event %d %s after its turn's outcome: %v", i, ev, evs)
		}
		ended[ev.turn] = ev.kind == "turn.outcome"
		if i > 0 {
			for j := range ev.id {
				if ev.id[j] < evs[i-1].id[j] {
					t.Fatalf("event %d's id %s goes back from %s: %v", i, ev.id, evs[i-1].id, evs)
				}
			}
		}
	}
}

// sameEvents reports whether got and want stand for the same stored
// messages (by stream and sequence), in any order.
func sameEvents(got, want []placed) bool {
	key := func(evs []placed) []string {
		var out []string
		for _, ev := range evs {
			out = append(out, fmt.Sprintf("%d:%d", ev.src, ev.seq))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(got), key(want))
}

// turnEventKind is an event subject's kind, as the streams name it.
func turnEventKind(subject string) string {
	kind := strings.TrimPrefix(subject, eventPrefix)
	return kind[:strings.LastIndexByte(kind, '.')]
}

// The session stream has every event of its turns that the turn's own
// stream has, redrive events included: both keep an event by one rule. (A
// turn of two approvals, the first decided while the second is pending:
// its redrive is deferred. The move to started is in the turn's log, not
// an event: issue 36.)
func TestSessionStreamHasTheTurnStreamsEvents(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	session := g.openSSE("/v1/events?session=s-redrive", "a")
	sub := g.submit("a", submitBody("s-redrive", "alice",
		call("write_file", `{"path":"a.txt","content":"a"}`), call("write_file", `{"path":"b.txt","content":"b"}`)))
	for i, c := range sub.Calls {
		if c.Disposition != DispositionPending || c.ApprovalID == "" {
			t.Fatalf("call %d %+v, want pending with an approval", i, c)
		}
		resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
			DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
		want[DecisionResponse](t, resp, body, 200)
		if i == 0 {
			g.WaitRedrives(string(schemas.RedriveDeferred), sub.TurnID, 1)
		}
	}
	g.WaitOutcome(sub.TurnID)
	read := func(s *sseReader) []string {
		var seen []string
		for {
			ev := s.nextEvent(t, 10*time.Second)
			seen = append(seen, ev.kind+" "+ev.data) // an id is a position in its stream: two streams' differ
			if ev.kind == "turn.outcome" {
				return seen
			}
		}
	}
	// The same events; the order of a decision (from the approvals
	// bucket) and the redrive it caused (from TOLLGATE_EVENTS) is the
	// order they reached the feed live, their stored order catching up.
	inSession := read(session)
	ofTurn := read(g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a"))
	if !slices.Equal(slices.Sorted(slices.Values(inSession)), slices.Sorted(slices.Values(ofTurn))) {
		t.Fatalf("the session stream has %v, the turn's %v", inSession, ofTurn)
	}
	if !slices.ContainsFunc(ofTurn, func(s string) bool { return strings.HasPrefix(s, "redrive.deferred ") }) {
		t.Fatalf("no redrive.deferred event among %v", ofTurn)
	}
	if slices.ContainsFunc(ofTurn, func(s string) bool {
		return strings.HasPrefix(s, "redrive.started ") || strings.HasPrefix(s, "batch.awaiting ")
	}) {
		t.Fatalf("a redrive.started or batch.awaiting event among %v: no longer published for a turn of this version", ofTurn)
	}
}

// A Last-Event-ID that is no event's id (beyond the stream's last, the
// approvals bucket's included, past uint64, negative, not a number, naming
// another number of streams, a split position in the approvals' place) is
// 400 INVALID_INPUT on both streams.
func TestLastEventIDOutOfRangeIsInvalidInput(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub := g.submit("a", submitBody("s-bad-id", "alice", call("echo", `{"text":"1"}`)))
	g.WaitOutcome(sub.TurnID)
	for _, path := range []string{"/v1/events?session=s-bad-id", "/v1/turns/" + sub.TurnID + "/events"} {
		for _, id := range []string{"18446744073709551615", "18446744073709551616", "9223372036854775808", "99999999", "-1", "1e3", "x",
			"1.0.0.0.99999999", "1.0.0.0.0.99999999", "1.0.0", "1.0.0.0.0.0.0", "1..0.0.0", "1.0.0.0.", "1.0.0.0.0.281474976710657"} {
			resp, body := g.tryOpen(path, "a", "Last-Event-ID", id)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s with Last-Event-ID %s: %d %s", path, id, resp.StatusCode, body)
				continue
			}
			wantProblem(t, resp, body, http.StatusBadRequest, schemas.CodeInvalidInput)
		}
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		resp, body := g.tryOpen(path+sep+"last_event_id=18446744073709551615", "a")
		wantProblem(t, resp, body, http.StatusBadRequest, schemas.CodeInvalidInput)
	}
}
