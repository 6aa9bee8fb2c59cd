package gateway

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A long poll (GET /v1/turns/{id}?wait=) wakes on the write of the turn's
// batch wherever the batch is kept: an append to the turn's log (every
// batch written now), or a write to tollgate_batches of a batch an earlier
// version left there, which finishes there. The waits' fallback read is
// off, so only the batches feed can end a poll before its wait runs out;
// a plain GET reads the batch in either place.
func TestLongPollWakesOnTheBatchWhereItIsKept(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	g.s.feed.fallback = time.Hour
	for _, c := range []struct {
		name     string
		bucketed bool
	}{{"kept in its turn's log", false}, {"an earlier version's, kept in the bucket", true}} {
		t.Run(c.name, func(t *testing.T) {
			session := "s-where-log"
			if c.bucketed {
				session = "s-where-bucket"
			}
			sub, call := g.submitGated("a", session, "alice")
			if c.bucketed {
				g.WaitIdle(pipelinetest.AllStages...) // nothing moves the batch while it is moved
				g.MakeBucketed(sub.TurnID)
			}
			resp, body := g.do("GET", "/v1/turns/"+sub.TurnID, "a", nil)
			if v := want[TurnView](t, resp, body, http.StatusOK); v.State != schemas.BatchAwaiting || len(v.Calls) != 1 || v.Calls[0].Disposition != DispositionPending {
				t.Fatalf("GET of the awaiting turn: %+v", v)
			}

			type result struct {
				v      TurnView
				status int
				err    error
			}
			done := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest("GET", g.url+"/v1/turns/"+sub.TurnID+"?wait=20s", nil)
				req.Header.Set("Authorization", "Bearer "+g.tokens["a"])
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					done <- result{err: err}
					return
				}
				defer resp.Body.Close()
				var v TurnView
				err = json.NewDecoder(resp.Body).Decode(&v)
				done <- result{v, resp.StatusCode, err}
			}()
			// The poll has read the turn (awaiting) and waits on the feed
			// before the decision goes in: only a write the feed reports
			// can answer it with the completed batch.
			jstest.Eventually(t, jstest.Wait, "the long poll waits on the feed", func() bool {
				g.s.feed.mu.Lock()
				defer g.s.feed.mu.Unlock()
				return len(g.s.feed.waiters[sub.TurnID]) > 0
			})
			g.Submit(g.Decision(call.ApprovalID, "approve", "gateway", "alice"))
			var r result
			select {
			case r = <-done:
			case <-jstest.After(30 * time.Second):
				t.Fatal("the long poll did not answer")
			}
			if r.err != nil || r.status != http.StatusOK || r.v.State != schemas.BatchCompleted || r.v.Calls[0].Disposition != DispositionRan {
				t.Fatalf("long poll: status %d, %v, %+v; want the completed turn before the wait ran out", r.status, r.err, r.v)
			}
			if b := g.Batch(sub.TurnID); b == nil || b.Bucketed() != c.bucketed || b.State != schemas.BatchCompleted {
				t.Fatalf("the batch ended %+v (bucketed %v), want completed where it was kept", b, b != nil && b.Bucketed())
			}
		})
	}
}
