package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
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

// consumers is how many consumers TOLLGATE_EVENTS has.
func (g *gw) consumers() int {
	g.t.Helper()
	ctx := jstest.Ctx(g.t)
	st, err := g.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		g.t.Fatal(err)
	}
	return st.CachedInfo().State.Consumers
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
// leave TOLLGATE_EVENTS with the consumers it had plus the gateway's one:
// a read-only key cannot use up the stream's consumers.
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
	// The feed's consumer, and none per stream: the replay consumers are
	// deleted as their streams catch up or end.
	jstest.Eventually(t, jstest.Wait, "the events stream's consumers back to one more than before", func() bool {
		return g.consumers() <= before+1
	})
	if n := g.consumers(); n > before+1 {
		t.Fatalf("%d consumers on %s after 200 streams, want at most %d", n, topology.StreamEvents, before+1)
	}
}

// A session stream resumed with Last-Event-ID delivers exactly the events
// of the session's turns stored after that id, in order, none twice: those
// stored while the client was away and those stored after it came back.
func TestSessionStreamResumesExactlyAfterTheID(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	var turns []string
	for i := range 3 {
		sub := g.submit("a", submitBody("s-resume", "alice", call("echo", `{"text":"`+strconv.Itoa(i)+`"}`)))
		g.WaitOutcome(sub.TurnID)
		turns = append(turns, sub.TurnID)
	}
	// An id of an earlier version (a bare TOLLGATE_EVENTS sequence: the
	// published outcome of the first turn) resumes after that event.
	outcome := g.Events(topology.SubjectTurnOutcome + turns[0])
	after := outcome[0].Seq
	stream := g.openSSE("/v1/events?session=s-resume", "a", "Last-Event-ID", strconv.FormatUint(after, 10))
	last := g.submit("a", submitBody("s-resume", "alice", call("echo", `{"text":"last"}`)))
	turns = append(turns, last.TurnID)
	read := func(s *sseReader) (evs []sseEvent, got []string) {
		for {
			ev := s.nextEvent(t, 10*time.Second)
			var p struct {
				TurnID string `json:"turn_id"`
			}
			_ = json.Unmarshal([]byte(ev.data), &p)
			evs, got = append(evs, ev), append(got, ev.kind+" "+p.TurnID)
			if ev.kind == "turn.outcome" && p.TurnID == last.TurnID {
				return evs, got
			}
		}
	}
	evs, got := read(stream)
	var want []string
	for _, m := range g.Events("tollgate.event.>") {
		if turn := turnOfEvent(m.Subject); m.Seq > after && slices.Contains(turns, turn) {
			want = append(want, turnEventKind(m.Subject)+" "+turn)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events after %d: got %v, want %v", after, got, want)
	}
	// The id of any event this version sent resumes exactly after it.
	for _, k := range []int{0, 1, len(evs) - 2} {
		_, rest := read(g.openSSE("/v1/events?session=s-resume", "a", "Last-Event-ID", evs[k].id))
		if !slices.Equal(rest, got[k+1:]) {
			t.Fatalf("events after %s: got %v, want %v", evs[k].id, rest, got[k+1:])
		}
	}
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
	inSession := read(session)
	ofTurn := read(g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a"))
	if !slices.Equal(inSession, ofTurn) {
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

// A Last-Event-ID that is no event's id (beyond the stream's last, past
// uint64, negative, not a number) is 400 INVALID_INPUT on both streams.
func TestLastEventIDOutOfRangeIsInvalidInput(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub := g.submit("a", submitBody("s-bad-id", "alice", call("echo", `{"text":"1"}`)))
	g.WaitOutcome(sub.TurnID)
	for _, path := range []string{"/v1/events?session=s-bad-id", "/v1/turns/" + sub.TurnID + "/events"} {
		for _, id := range []string{"18446744073709551615", "18446744073709551616", "9223372036854775808", "99999999", "-1", "1e3", "x",
			"1.0.0.0.99999999", "1.0.0", "1.0.0.0.0.0", "1..0.0.0", "1.0.0.0."} {
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
