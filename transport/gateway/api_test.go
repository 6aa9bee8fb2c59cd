package gateway

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestSubmitReportsEachCallsDisposition: a turn with a never-mode call, a
// gated call and a denied one is answered 202 with its deterministic turn
// id, Location, and each call's disposition once the executor evaluated
// it: ran (with its result), pending (with its approval id), denied.
func TestSubmitReportsEachCallsDisposition(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	resp, body := g.do("POST", "/v1/turns", "a", SubmitRequest{
		SessionID: "s-disp", Sender: SenderIn{ID: "alice"}, Channel: ChannelIn{Kind: "public", ID: "c1"},
		Calls: []CallIn{call("echo", `{"text":"hi"}`), call("write_file", `{"path":"x.txt","content":"x"}`), call("nope.tool", `{}`)},
	}, "Idempotency-Key", "req-1")
	got := want[SubmitResponse](t, resp, body, http.StatusAccepted)
	// The Idempotency-Key names the message within the key (docs/api.md).
	turn := schemas.TurnID("gateway", "k-"+hashParts("turn", "gateway", keyID(t, g.tokens["a"]), "req-1")[:32])
	if got.TurnID != turn || resp.Header.Get("Location") != "/v1/turns/"+turn || got.Transport != "gateway" || got.Duplicate {
		t.Fatalf("response %+v, Location %q; want turn %s", got, resp.Header.Get("Location"), turn)
	}
	if got.State != string(schemas.BatchCompleted) && got.State != string(schemas.BatchAwaiting) {
		t.Fatalf("state %q: want the executor's first facts within the submit wait", got.State)
	}
	// write_file is denied for public audiences by the built-in policy:
	// use the disposition the policy gives.
	want := []string{DispositionRan, string(schemas.ResultDenied), string(schemas.ResultFailed)}
	for i, c := range got.Calls {
		if c.Disposition != want[i] {
			t.Errorf("call %d (%s): disposition %q, want %q (%+v)", i, c.Tool, c.Disposition, want[i], c.Result)
		}
	}
	if r := got.Calls[0].Result; r == nil || r.Output != "hi" {
		t.Errorf("echo result %+v", r)
	}
	if r := got.Calls[1].Result; r == nil || r.Code != schemas.CodePolicyDenied {
		t.Errorf("write_file result %+v, want POLICY_DENIED", r)
	}
	if r := got.Calls[2].Result; r == nil || r.Code != schemas.CodeToolNotFound {
		t.Errorf("unknown tool result %+v, want TOOL_NOT_FOUND", r)
	}
}

// submitGated submits a write_file call in a DM (needs approval) as key
// and returns the pending call.
func (g *gw) submitGated(key, session, sender string) (SubmitResponse, CallView) {
	g.t.Helper()
	got := g.submit(key, submitBody(session, sender, call("write_file", `{"path":"a.txt","content":"a"}`)))
	c := got.Calls[0]
	if c.Disposition != DispositionPending || c.ApprovalID == "" || c.Approval == nil || c.Approval.Status != schemas.ApprovalPending {
		g.t.Fatalf("gated call %+v, want pending with an approval", c)
	}
	return got, c
}

// TestApproveOverTheAPI: a gated call is pending with its approval id; the
// approval is listed and readable; a decision carrying the digest shown is
// answered with the approver's verdict; the turn then shows the result
// and who decided.
func TestApproveOverTheAPI(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub, c := g.submitGated("a", "s-approve", "alice")

	resp, body := g.do("GET", "/v1/approvals?status=pending", "a", nil)
	list := want[ApprovalList](t, resp, body, http.StatusOK)
	if len(list.Approvals) != 1 || list.Approvals[0].ApprovalID != c.ApprovalID || list.Approvals[0].Requester != "gateway:alice" {
		t.Fatalf("pending approvals %+v, want %s", list.Approvals, c.ApprovalID)
	}
	resp, body = g.do("GET", "/v1/approvals/"+c.ApprovalID, "a", nil)
	a := want[ApprovalView](t, resp, body, http.StatusOK)
	if a.ArgsDigest != c.ArgsDigest || a.Tool != "write_file" || a.TurnID != sub.TurnID {
		t.Fatalf("approval %+v", a)
	}

	resp, body = g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve", ArgsDigest: a.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	d := want[DecisionResponse](t, resp, body, http.StatusOK)
	if d.Status != string(schemas.ApprovalApproved) || d.Decision == nil || d.Decision.Principal != "gateway:alice" {
		t.Fatalf("decision %+v", d)
	}

	resp, body = g.do("GET", "/v1/turns/"+sub.TurnID+"?wait=15s", "a", nil)
	v := want[TurnView](t, resp, body, http.StatusOK)
	if v.State != schemas.BatchCompleted || !v.Terminal {
		t.Fatalf("turn %+v, want completed", v)
	}
	cv := v.Calls[0]
	if cv.Disposition != DispositionRan || cv.Result.Status != schemas.ResultOK || cv.Approval.Decision.Principal != "gateway:alice" || cv.Approval.Decision.Option != "approve" {
		t.Fatalf("call %+v / %+v / %+v", cv, cv.Result, cv.Approval)
	}
	// The decided approval in the view (the gateway's copy, rebuilt from the
	// decided event) is the record as stored.
	stored, err := json.Marshal(approvalView(g.Approval(c.ApprovalID)))
	if err != nil {
		t.Fatal(err)
	}
	if served, _ := json.Marshal(cv.Approval); string(served) != string(stored) {
		t.Fatalf("approval in the view\n%s\nas stored\n%s", served, stored)
	}
	resp, body = g.do("GET", "/v1/approvals?status=pending", "a", nil)
	if l := want[ApprovalList](t, resp, body, http.StatusOK); len(l.Approvals) != 0 {
		t.Errorf("still pending: %+v", l.Approvals)
	}
}

// TestDecisionRejectionsCarryTheApproversCode: a decision the approver
// refuses is answered with its code: someone who is not the requester, and
// a decider from a key that may not vouch (so the decider is unverified).
// A key that may not vouch cannot claim a verified sender either.
func TestDecisionRejectionsCarryTheApproversCode(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	_, c := g.submitGated("a", "s-rej", "alice")
	for _, tc := range []struct {
		name, key string
		decider   SenderIn
		status    int
		code      schemas.Code
	}{
		{"a decider who is not the requester", "a", SenderIn{ID: "mallory"}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
		{"a decider a non-vouching key sent", "novouch", SenderIn{ID: "alice"}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", tc.key,
				DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: tc.decider})
			wantProblem(t, resp, body, tc.status, tc.code)
		})
	}
	yes := true
	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "novouch",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice", Verified: &yes}})
	wantProblem(t, resp, body, http.StatusForbidden, CodeScopeMissing)
	if a := g.Approval(c.ApprovalID); a.Status != schemas.ApprovalPending {
		t.Errorf("approval %s, want still pending", a.Status)
	}
}

// TestIdempotencyKey: a retried submit with the same Idempotency-Key
// returns the same turn and stores nothing new; the same key with another
// body is 409 IDEMPOTENCY_KEY_REUSED and stores nothing; another API key
// sending it makes a turn of its own. Both before the
// turn is accepted (no ingest running: the stream's duplicate
// acknowledgement) and after it ran (its batch).
func TestIdempotencyKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stages []string
	}{
		{"before the turn is accepted", []string{}},
		{"after the turn ran", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, pipelinetest.Options{Stages: tc.stages}, func(c *Config) { c.SubmitWait = time.Second })
			req := submitBody("s-idem", "alice", call("echo", `{"text":"one"}`))
			first := g.submit("a", req, "Idempotency-Key", "k-1")
			if tc.stages == nil {
				g.WaitTerminal(first.TurnID)
			}
			// Same request, arguments written differently: the same turn.
			req.Calls[0].Args = json.RawMessage(`{ "text" : "one" }`)
			again := g.submit("a", req, "Idempotency-Key", "k-1")
			if again.TurnID != first.TurnID || !again.Duplicate || first.Duplicate {
				t.Fatalf("first %+v, retry %+v: want the same turn, the retry a duplicate", first, again)
			}
			req.Calls[0].Args = json.RawMessage(`{"text":"two"}`)
			resp, body := g.do("POST", "/v1/turns", "a", req, "Idempotency-Key", "k-1")
			wantProblem(t, resp, body, http.StatusConflict, CodeIdempotencyKeyReused)
			// Idempotency-Keys are the key's own: another key of the
			// transport (a rotated one too) sending the same value makes
			// its own turn, and cannot block or join this one.
			other := g.submit("a2", req, "Idempotency-Key", "k-1")
			if other.TurnID == first.TurnID || other.Duplicate {
				t.Fatalf("another key's request with the same Idempotency-Key: %+v, want a turn of its own", other)
			}
			if n := g.count(topology.StreamInbound, "tollgate.inbound.>"); n != 2 {
				t.Errorf("%d inbound messages stored, want 2", n)
			}
		})
	}
}

// TestSubmitWithoutIdempotencyKey: a request without an Idempotency-Key
// gets a fresh message id, so the same body sent twice is two turns, each
// stored once; the answer carries its Content-Length.
func TestSubmitWithoutIdempotencyKey(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, func(c *Config) { c.SubmitWait = 100 * time.Millisecond })
	req := submitBody("s-nokey", "alice", call("echo", `{"text":"one"}`))
	first := g.submit("a", req)
	resp, body := g.do("POST", "/v1/turns", "a", req)
	second := want[SubmitResponse](t, resp, body, http.StatusAccepted)
	if first.TurnID == second.TurnID || first.Duplicate || second.Duplicate {
		t.Fatalf("first %+v, second %+v: want two new turns", first, second)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %q for a body of %d bytes", cl, len(body))
	}
	if n := g.count(topology.StreamInbound, "tollgate.inbound.>"); n != 2 {
		t.Errorf("%d inbound messages stored, want 2", n)
	}
}

// TestLongPoll: GET ?wait= returns as soon as the turn is terminal (here:
// once its approval is decided through the pipeline, as the CLI would),
// and with the current state when the wait runs out first.
func TestLongPoll(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub, c := g.submitGated("a", "s-poll", "alice")

	start := time.Now()
	resp, body := g.do("GET", "/v1/turns/"+sub.TurnID+"?wait=300ms", "a", nil)
	if v := want[TurnView](t, resp, body, http.StatusOK); v.State != schemas.BatchAwaiting || v.Terminal {
		t.Fatalf("after the wait ran out: %+v, want awaiting", v)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("answered after %v: a turn that is not terminal is held for the wait", took)
	}
	type result struct {
		v    TurnView
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		req, _ := http.NewRequest("GET", g.url+"/v1/turns/"+sub.TurnID+"?wait=30s", nil)
		req.Header.Set("Authorization", "Bearer "+g.tokens["a"])
		resp, err := http.DefaultClient.Do(req)
		var v TurnView
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
		}
		done <- result{v, time.Since(start)}
	}()
	// The poll is waiting (the turn awaits a decision) while the decision
	// goes in through the bus, as another transport of the same name would
	// send it.
	g.Submit(g.Decision(c.ApprovalID, "approve", "gateway", "alice"))
	r := <-done
	if r.v.State != schemas.BatchCompleted || r.took >= 30*time.Second {
		t.Fatalf("long poll: %+v after %v, want completed before the wait ran out", r.v, r.took)
	}
	resp, body = g.do("GET", "/v1/turns/t-00000000000000000000?wait=200ms", "a", nil)
	wantProblem(t, resp, body, http.StatusNotFound, CodeTurnNotFound)
	resp, body = g.do("GET", "/v1/turns/"+sub.TurnID+"?wait=soon", "a", nil)
	wantProblem(t, resp, body, http.StatusBadRequest, schemas.CodeInvalidInput)
}

// TestAKeySeesOnlyItsTransport: a key bound to transport "other" can
// neither read nor decide the approvals and turns of transport "gateway",
// and its decision attempt publishes nothing.
func TestAKeySeesOnlyItsTransport(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	sub, c := g.submitGated("a", "s-keys", "alice")

	resp, body := g.do("GET", "/v1/approvals/"+c.ApprovalID, "b", nil)
	wantProblem(t, resp, body, http.StatusNotFound, schemas.CodeApprovalNotFound)
	resp, body = g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "b",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	wantProblem(t, resp, body, http.StatusNotFound, schemas.CodeApprovalNotFound)
	resp, body = g.do("GET", "/v1/approvals?status=all", "b", nil)
	if l := want[ApprovalList](t, resp, body, http.StatusOK); len(l.Approvals) != 0 {
		t.Errorf("key b lists %+v", l.Approvals)
	}
	resp, body = g.do("GET", "/v1/turns/"+sub.TurnID, "b", nil)
	wantProblem(t, resp, body, http.StatusNotFound, CodeTurnNotFound)
	resp, body = g.do("GET", "/v1/turns/"+sub.TurnID+"/events", "b", nil)
	wantProblem(t, resp, body, http.StatusNotFound, CodeTurnNotFound)
	// The read-only key of the right transport may read, not decide.
	resp, body = g.do("GET", "/v1/approvals/"+c.ApprovalID, "readonly", nil)
	want[ApprovalView](t, resp, body, http.StatusOK)
	resp, body = g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "readonly",
		DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	wantProblem(t, resp, body, http.StatusForbidden, CodeScopeMissing)

	if n := g.count(topology.StreamDecisions, "tollgate.decision.>"); n != 0 {
		t.Errorf("%d decisions stored, want none", n)
	}
	if a := g.Approval(c.ApprovalID); a.Status != schemas.ApprovalPending {
		t.Errorf("approval %s, want pending", a.Status)
	}
}

// TestBadInputNeverReachesTheBus: each bad request gets its status and
// code, and neither the inbound nor the decision stream receives anything.
func TestBadInputNeverReachesTheBus(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.MaxBodyBytes = 64 << 10 })
	_, c := g.submitGated("a", "s-bad", "alice")
	inbound := g.count(topology.StreamInbound, "tollgate.inbound.>")
	decide := "/v1/approvals/" + c.ApprovalID + "/decisions"
	good := DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}}
	huge := []byte(`{"session_id":"s","sender":{"id":"a"},"text":"` + strings.Repeat("x", 100<<10) + `"}`)
	for _, tc := range []struct {
		name, method, path, key string
		body                    any
		status                  int
		code                    schemas.Code
	}{
		{"malformed JSON", "POST", "/v1/turns", "a", []byte(`{"session_id": "s",`), http.StatusBadRequest, schemas.CodeMalformed},
		{"two JSON objects", "POST", "/v1/turns", "a", []byte(`{"session_id":"s","sender":{"id":"a"}} {}`), http.StatusBadRequest, schemas.CodeMalformed},
		{"a JSON array", "POST", "/v1/turns", "a", []byte(`[1]`), http.StatusBadRequest, schemas.CodeMalformed},
		{"an unknown field", "POST", "/v1/turns", "a", []byte(`{"session_id":"s","sender":{"id":"a"},"sesion":"x"}`), http.StatusBadRequest, schemas.CodeInvalidInput},
		{"a huge body", "POST", "/v1/turns", "a", huge, http.StatusRequestEntityTooLarge, schemas.CodePayloadTooLarge},
		{"a message ingest would refuse (no session)", "POST", "/v1/turns", "a", submitBody("", "alice"), http.StatusUnprocessableEntity, schemas.CodeInvalidInput},
		{"arguments that are not an object", "POST", "/v1/turns", "a", submitBody("s", "alice", call("echo", `[1]`)), http.StatusUnprocessableEntity, schemas.CodeArgsInvalidJSON},
		{"a channel kind that does not exist", "POST", "/v1/turns", "a", SubmitRequest{SessionID: "s", Sender: SenderIn{ID: "a"}, Channel: ChannelIn{Kind: "everyone"}}, http.StatusUnprocessableEntity, schemas.CodeInvalidInput},
		{"a missing key", "POST", "/v1/turns", "", submitBody("s", "alice"), http.StatusUnauthorized, CodeUnauthenticated},
		{"an expired key", "POST", "/v1/turns", "expired", submitBody("s", "alice"), http.StatusUnauthorized, CodeKeyExpired},
		{"a key without the submit scope", "POST", "/v1/turns", "readonly", submitBody("s", "alice"), http.StatusForbidden, CodeScopeMissing},
		{"an unknown approval", "POST", "/v1/approvals/a-00000000000000000000-0/decisions", "a", good, http.StatusNotFound, schemas.CodeApprovalNotFound},
		{"a wrong digest", "POST", decide, "a", DecisionRequest{Option: "approve", ArgsDigest: "sha256:" + strings.Repeat("0", 64), Decider: SenderIn{ID: "alice"}}, http.StatusConflict, schemas.CodeArgsDigestMismatch},
		{"no digest", "POST", decide, "a", DecisionRequest{Option: "approve", Decider: SenderIn{ID: "alice"}}, http.StatusUnprocessableEntity, schemas.CodeInvalidInput},
		{"an option not offered", "POST", decide, "a", DecisionRequest{Option: "maybe", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}}, http.StatusUnprocessableEntity, schemas.CodeOptionNotOffered},
		{"a decision with an expired key", "POST", decide, "expired", good, http.StatusUnauthorized, CodeKeyExpired},
		{"a decision without a key", "POST", decide, "", good, http.StatusUnauthorized, CodeUnauthenticated},
		{"a malformed decision", "POST", decide, "a", []byte(`{"option":`), http.StatusBadRequest, schemas.CodeMalformed},
		{"an unknown status filter", "GET", "/v1/approvals?status=maybe", "a", nil, http.StatusBadRequest, schemas.CodeInvalidInput},
		{"a session stream without a session", "GET", "/v1/events", "a", nil, http.StatusBadRequest, schemas.CodeInvalidInput},
		{"a bad Last-Event-ID", "GET", "/v1/events?session=s", "a", nil, http.StatusBadRequest, schemas.CodeInvalidInput},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.name == "a bad Last-Event-ID" {
				hdr = []string{"Last-Event-ID", "yesterday"}
			}
			resp, body := g.do(tc.method, tc.path, tc.key, tc.body, hdr...)
			wantProblem(t, resp, body, tc.status, tc.code)
		})
	}
	if n := g.count(topology.StreamInbound, "tollgate.inbound.>"); n != inbound {
		t.Errorf("%d inbound messages, want %d: bad input reached the bus", n, inbound)
	}
	if n := g.count(topology.StreamDecisions, "tollgate.decision.>"); n != 0 {
		t.Errorf("%d decisions stored, want none", n)
	}
}

// TestRateLimitPerKey: past its burst, a key is refused 429 RATE_LIMITED
// with Retry-After; another key is not affected.
func TestRateLimitPerKey(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, func(c *Config) { c.Rate, c.Burst = 0.001, 2 })
	for range 2 {
		resp, body := g.do("GET", "/v1/approvals", "a", nil)
		want[ApprovalList](t, resp, body, http.StatusOK)
	}
	resp, body := g.do("GET", "/v1/approvals", "a", nil)
	wantProblem(t, resp, body, http.StatusTooManyRequests, CodeRateLimited)
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	resp, body = g.do("GET", "/v1/approvals", "b", nil)
	want[ApprovalList](t, resp, body, http.StatusOK)
}

// TestKeysFile: keys load from a file, hashed; an unknown field, a bad
// scope or a duplicate id is refused.
func TestKeysFile(t *testing.T) {
	tok, k := NewKey("gateway", []Scope{ScopeRead}, false)
	if strings.Contains(k.Hash, strings.Split(tok, "_")[2]) || k.Hash != HashToken(tok) {
		t.Fatalf("key %+v stores its secret or the wrong hash", k)
	}
	dir := t.TempDir()
	write := func(s string) string {
		p := dir + "/keys.json"
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, _ := json.Marshal(KeysFile{Keys: []Key{k}})
	keys, err := LoadKeys(write(string(good)))
	if err != nil || len(keys) != 1 || keys[0].Hash != k.Hash {
		t.Fatalf("LoadKeys: %v %+v", err, keys)
	}
	for name, bad := range map[string]string{
		"an unknown field": `{"keys":[{"id":"abc","hash":"` + k.Hash + `","transport":"gateway","scopes":["read"],"admin":true}]}`,
		"an unknown scope": `{"keys":[{"id":"abc","hash":"` + k.Hash + `","transport":"gateway","scopes":["root"]}]}`,
		"a duplicate id":   `{"keys":[{"id":"abc","hash":"` + k.Hash + `","transport":"gateway","scopes":["read"]},{"id":"abc","hash":"` + k.Hash + `","transport":"gateway","scopes":["read"]}]}`,
		"a bad transport":  `{"keys":[{"id":"abc","hash":"` + k.Hash + `","transport":"Gate.way","scopes":["read"]}]}`,
		"a plain secret":   `{"keys":[{"id":"abc","hash":"hunter2","transport":"gateway","scopes":["read"]}]}`,
	} {
		if _, err := LoadKeys(write(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
