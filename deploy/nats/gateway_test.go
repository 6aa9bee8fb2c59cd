package natsconf_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	followers "github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
	"github.com/tollgate-dev/tollgate/transport/gateway"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// TestGatewayUserServesTheAPI runs the HTTP gateway as the gateway user of
// least-privilege.conf in front of the stages, each as its own user: a
// gated turn is submitted, streamed, decided and long-polled to its
// result, and a retried submit is recognised, with no permission refused
// on the way, while the gateway runs outgoing webhooks (a delivery, a
// dead letter). Then the user is shown to be refused another transport's
// subjects, KV writes and the durables on the events stream.
func TestGatewayUserServesTheAPI(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	runStages(t, ns, t.TempDir())
	gw := dial(t, ns, "gateway")
	token, key := gateway.NewKey("gateway", []gateway.Scope{gateway.ScopeSubmit, gateway.ScopeRead, gateway.ScopeDecide}, true)
	// Webhooks run by the gateway: one receiver takes the outcomes, one
	// answers 410 Gone (its events are dead-lettered at once).
	outcomes := make(chan []byte, 16)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		outcomes <- b
	}))
	t.Cleanup(receiver.Close)
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) }))
	t.Cleanup(gone.Close)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	hooks, err := webhook.New(gw.js, webhook.Config{Logger: pipelinetest.Logger(), Subscribers: []webhook.Subscriber{
		{ID: "rx", URL: receiver.URL, Secret: secret, Transports: []string{"gateway"}, Events: []webhook.Event{webhook.EventOutcome}},
		{ID: "gone", URL: gone.URL, Secret: secret, Transports: []string{"gateway"}, Events: []webhook.Event{webhook.EventApprovalRequested}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := gateway.New(gateway.Config{JS: gw.js, Policy: policy.Default(), Keys: []gateway.Key{key}, Logger: pipelinetest.Logger(),
		SubmitWait: 10 * time.Second, Webhooks: hooks, Registerer: reg})
	if err != nil {
		t.Fatalf("gateway as user gateway: %v (server said %v)", err, gw.reported())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopGateway := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(runCtx, ln) }()
	t.Cleanup(func() {
		stopGateway()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// The webhooks' consumers start with the events stored after they are
	// made: wait for them before the turn.
	jstest.Eventually(t, wait, "the webhooks' consumers consume", func() bool { return hooks.Ready() == nil })
	srv := struct{ URL string }{"http://" + ln.Addr().String()}
	do := func(method, path string, body any, out any, hdr ...string) int {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+token)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %d: %v", method, path, resp.StatusCode, err)
		}
		return resp.StatusCode
	}

	sub := gateway.SubmitRequest{SessionID: "s-gw", Sender: gateway.SenderIn{ID: "alice"},
		Calls: []gateway.CallIn{{Tool: "write_file", Args: json.RawMessage(`{"path":"g.txt","content":"g"}`)}}}
	var res gateway.SubmitResponse
	if code := do("POST", "/v1/turns", sub, &res, "Idempotency-Key", "lp-1"); code != http.StatusAccepted || len(res.Calls) != 1 || res.Calls[0].Disposition != gateway.DispositionPending {
		t.Fatalf("submit: %d %+v (server said %v)", code, res, gw.reported())
	}
	c := res.Calls[0]

	// The turn's events, from its first, while it is decided.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/turns/"+res.TurnID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %v %v", err, resp)
	}
	defer resp.Body.Close()
	kinds := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if k, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				kinds <- k
			}
		}
		close(kinds)
	}()

	var list gateway.ApprovalList
	if code := do("GET", "/v1/approvals", nil, &list); code != http.StatusOK || len(list.Approvals) != 1 {
		t.Fatalf("approvals: %d %+v", code, list)
	}
	// The page's records came in one batched direct get, which the
	// gateway user may send (not one get each, its fallback).
	if n, err := testutil.GatherAndCount(reg, "tollgate_gateway_list_reads_total"); err != nil || n != 1 {
		t.Fatalf("list reads: %d series (%v), want one: batched only (server said %v)", n, err, gw.reported())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tollgate_gateway_list_reads_total Reads of a list page's approval records: "batched" (one batched direct get) or "one_by_one" (a get per record: a bucket without direct gets, or after a batched get failed, which counts "batch_failed" and reads one by one for a minute).
# TYPE tollgate_gateway_list_reads_total counter
tollgate_gateway_list_reads_total{how="batched"} 1
`), "tollgate_gateway_list_reads_total"); err != nil {
		t.Fatalf("list reads: %v (server said %v)", err, gw.reported())
	}
	var d gateway.DecisionResponse
	if code := do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", gateway.DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: gateway.SenderIn{ID: "alice"}}, &d); code != http.StatusOK || d.Status != "approved" {
		t.Fatalf("decide: %d %+v (server said %v)", code, d, gw.reported())
	}
	var v gateway.TurnView
	if code := do("GET", "/v1/turns/"+res.TurnID+"?wait=20s", nil, &v); code != http.StatusOK || v.State != schemas.BatchCompleted || v.Calls[0].Result.Status != schemas.ResultOK {
		t.Fatalf("turn: %d %+v", code, v)
	}
	timeout := jstest.After(wait)
	for done := false; !done; {
		select {
		case k, ok := <-kinds:
			if !ok {
				t.Fatal("event stream ended")
			}
			done = k == "turn.outcome"
		case <-timeout:
			t.Fatal("no turn.outcome event")
		}
	}
	select {
	case b := <-outcomes:
		if !bytes.Contains(b, []byte(res.TurnID)) || !bytes.Contains(b, []byte(`"type":"outcome"`)) {
			t.Fatalf("webhook delivery %s, want the outcome of %s", b, res.TurnID)
		}
	case <-jstest.After(wait):
		t.Fatalf("no webhook delivery (server said %v)", gw.reported())
	}
	eventually(t, "the refused webhook event is dead-lettered", func(c context.Context) bool {
		return stored(t, admin, topology.StreamDLQ, "tollgate.dlq.webhook.gone") == 1
	})
	var again gateway.SubmitResponse
	if code := do("POST", "/v1/turns", sub, &again, "Idempotency-Key", "lp-1"); code != http.StatusAccepted || !again.Duplicate || again.TurnID != res.TurnID {
		t.Fatalf("retry: %d %+v", code, again)
	}
	if errs := gw.reported(); len(errs) != 0 {
		t.Fatalf("the gateway user was refused: %v", errs)
	}

	t.Run("refused what its grants leave out", func(t *testing.T) {
		other := topology.InboundSubject("cli", "s-gw")
		done := make(chan error, 5) // the attempts' own outcomes; the refusals are what is checked
		go func() { done <- gw.nc.Publish(other, []byte("x")) }()
		gw.waitDenied(t, other, make(chan error))
		kvKey := "$KV." + topology.BucketApprovals + "." + c.ApprovalID
		if err := gw.nc.Publish(kvKey, []byte("x")); err != nil {
			t.Fatal(err)
		}
		gw.waitDenied(t, kvKey, make(chan error))
		delRedriver := apiOf(gw) + "CONSUMER.DELETE." + topology.StreamEvents + ".redriver"
		go func() { _, err := gw.nc.Request(delRedriver, nil, 2*time.Second); done <- err }()
		gw.waitDenied(t, delRedriver, make(chan error))
		pull := apiOf(gw) + "CONSUMER.MSG.NEXT." + topology.StreamEvents + ".redriver"
		go func() { _, err := gw.nc.Request(pull, []byte(`{"batch":1}`), 2*time.Second); done <- err }()
		gw.waitDenied(t, pull, make(chan error))
		// Nor the outcome followers' durables on the turn logs, which its
		// feed's consumers reach by name.
		pullLog := apiOf(gw) + "CONSUMER.MSG.NEXT." + topology.TurnLogStream(0) + "." + followers.Durable("transport-slack", 0)
		go func() { _, err := gw.nc.Request(pullLog, []byte(`{"batch":1}`), 2*time.Second); done <- err }()
		gw.waitDenied(t, pullLog, make(chan error))
		ack := "$JS.ACK." + topology.StreamEvents + ".redriver.1.1.1.1.0"
		if err := gw.nc.Publish(ack, []byte("+ACK")); err != nil {
			t.Fatal(err)
		}
		gw.waitDenied(t, ack, make(chan error))
		if _, err := admin.js.Consumer(ctx(t, wait), topology.StreamEvents, "redriver"); err != nil {
			t.Fatalf("the redriver's durable: %v", err)
		}
		if a, err := admin.js.KeyValue(ctx(t, wait), topology.BucketApprovals); err != nil {
			t.Fatal(err)
		} else if e, err := a.Get(ctx(t, wait), c.ApprovalID); err != nil || string(e.Value()) == "x" {
			t.Fatalf("approval record: %v", err)
		}
		if n := stored(t, admin, topology.StreamInbound, other); n != 0 {
			t.Fatalf("%d messages on %s", n, other)
		}
	})
	// The gate tools it serves reach the stages that run tools, from
	// their own accounts: discovered and called as any tool service.
	for _, user := range []string{"executor", "redriver"} {
		t.Run(user+" discovers and calls the gateway's gate tools", func(t *testing.T) {
			c := dial(t, ns, user)
			ts, err := natstool.New(c.nc, natstool.Options{Logger: pipelinetest.Logger()}).Tools(ctx(t, wait))
			if err != nil {
				t.Fatalf("%s: discovery: %v", user, err)
			}
			i := slices.IndexFunc(ts, func(tl tools.Tool) bool { return tl.Name() == gateway.ClaudeGateService+".bash" })
			if i < 0 {
				t.Fatalf("%s: claude.bash not discovered (reported: %v)", user, c.reported())
			}
			tc := &schemas.TurnContext{TurnID: "claude:m-1", SessionID: "s-1", Transport: "gateway",
				Requester: schemas.Requester{Principal: "gateway:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true}}
			if out, err := ts[i].Run(ctx(t, wait), tools.Call{Context: tc, CallID: "claude:m-1-" + user, Args: `{}`}); err != nil || out != "allowed" {
				t.Fatalf("%s: claude.bash: %q, %v", user, out, err)
			}
			if r := c.reported(); len(r) != 0 {
				t.Fatalf("%s was refused: %v", user, r)
			}
		})
	}
	t.Run("cannot aim a publish acknowledgement at a KV key or a stream subject", func(t *testing.T) {
		adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
		if err != nil {
			t.Fatal(err)
		}
		noReplyInjection(t, admin, adminKV, gw, topology.InboundSubject("gateway", "s-gw-reply"))
	})
}
