package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// deafInbound makes TOLLGATE_INBOUND stop answering the gateway's
// inbound publishes until restore (jstest.Unanswered).
func deafInbound(t *testing.T, g *gw) (heard <-chan *nats.Msg, restore func()) {
	t.Helper()
	return jstest.Unanswered(t, g.Env, topology.StreamInbound, topology.SubjectInboundPrefix+"gateway.>")
}

// setStoreBounds shortens how long a submission tries to store its
// message, for one test.
func setStoreBounds(t *testing.T, attempt, wait time.Duration) {
	oldAttempt, oldWait := storeAttempt, storeWait
	storeAttempt, storeWait = attempt, wait
	t.Cleanup(func() { storeAttempt, storeWait = oldAttempt, oldWait })
}

// A submission whose first store gets no answer (on a cluster: a publish
// meeting a stream leader's election) is stored by a later attempt, once,
// and answered 202; its turn then runs to its outcome.
func TestASubmissionWhoseStoreGoesUnansweredIsStoredOnce(t *testing.T) {
	setStoreBounds(t, 300*time.Millisecond, jstest.Scale(jstest.Wait))
	g := startGateway(t, pipelinetest.Options{}, nil)
	heard, restore := deafInbound(t, g)
	go func() {
		<-heard // the first attempt, unanswered; the stream takes the next
		restore()
	}()
	sub := g.submit("a", submitBody("s-deaf", "alice", call("echo", `{"text":"one"}`)), "Idempotency-Key", "k-deaf")
	if sub.Duplicate {
		t.Fatalf("submission answered %+v: a new turn, not a duplicate", sub.SubmitResult)
	}
	if n := g.count(topology.StreamInbound, topology.SubjectInboundPrefix+"gateway.>"); n != 1 {
		t.Fatalf("%d inbound messages stored, want 1", n)
	}
	resp, body := g.do("GET", "/v1/turns/"+sub.TurnID+"?wait=10s", "a", nil)
	if v := want[TurnView](t, resp, body, http.StatusOK); v.State != schemas.BatchCompleted {
		t.Fatalf("turn %s is %s, want completed", sub.TurnID, v.State)
	}
}

// When the stream never answers, the submission is tried more than once
// and answered 503 UNAVAILABLE once its bound is spent, with nothing
// stored; the same request sent again (same Idempotency-Key) once the
// stream answers is stored, once.
func TestASubmissionTheStreamNeverStoresIsAnswered503(t *testing.T) {
	setStoreBounds(t, 200*time.Millisecond, time.Second)
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, func(c *Config) { c.SubmitWait = 100 * time.Millisecond })
	heard, restore := deafInbound(t, g)
	req := submitBody("s-never", "alice", call("echo", `{"text":"one"}`))
	start := time.Now()
	resp, body := g.do("POST", "/v1/turns", "a", req, "Idempotency-Key", "k-never")
	took := time.Since(start)
	wantProblem(t, resp, body, http.StatusServiceUnavailable, CodeUnavailable)
	if took < time.Second {
		t.Fatalf("answered after %v, before its 1 s bound", took)
	}
	restore()
	if n := len(heard); n < 2 {
		t.Fatalf("%d attempts before the 503, want more than one", n)
	}
	if n := g.count(topology.StreamInbound, topology.SubjectInboundPrefix+"gateway.>"); n != 0 {
		t.Fatalf("%d inbound messages stored after the 503, want none", n)
	}
	again := g.submit("a", req, "Idempotency-Key", "k-never")
	if again.Duplicate {
		t.Fatalf("the retry answered %+v: nothing was stored before it", again.SubmitResult)
	}
	if n := g.count(topology.StreamInbound, topology.SubjectInboundPrefix+"gateway.>"); n != 1 {
		t.Fatalf("%d inbound messages stored after the retry, want 1", n)
	}
}
