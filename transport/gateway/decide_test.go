package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// keyID is the id of the key whose token is tok (tg_<id>_<secret>).
func keyID(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, "_")
	if len(parts) != 3 || parts[0] != "tg" {
		t.Fatalf("token %q: want tg_<id>_<secret>", tok)
	}
	return parts[1]
}

// decide posts req on approval id with key name's token over HTTP and
// returns the status and body.
func (g *mcpGW) decide(key, id string, req DecisionRequest) (int, []byte) {
	g.t.Helper()
	return g.post(key, "/v1/approvals/"+id+"/decisions", req)
}

// TestTheAgentsKeyNeverApprovesItsOwnCalls: under a policy that leaves the
// requester among the deciders (hookPolicy: approvers cli:alice, the
// requester by default), the agent's key, the requester of its hook
// turns, posts a decision on its own gated call through the real decide
// endpoint: as itself, as itself claiming kind user, and through another
// key of its transport naming it. Each is refused DECIDER_NOT_AUTHORIZED
// by the approver, nothing is approved, and the hook is not allowed: the
// approval stays pending until alice denies it, and the hook then answers
// her deny.
func TestTheAgentsKeyNeverApprovesItsOwnCalls(t *testing.T) {
	g := startHooks(t, nil, "claude.write")
	self := keyID(t, g.tokens["a"])
	input := `{"content":"x","file_path":"/work/self"}`
	done := make(chan HookDecision, 1)
	go func() { done <- g.hook("a", "", "s-self", "Write", input) }()
	id := g.pendingFor("claude.write", input)
	a := g.Approval(id)
	if a.Context.Requester.Principal != "gateway:"+self {
		t.Fatalf("requester %s, want the key gateway:%s", a.Context.Requester.Principal, self)
	}
	for _, tc := range []struct {
		name, key string
		decider   SenderIn
	}{
		{"the key as itself", "a", SenderIn{ID: self}},
		{"the key as itself, claiming a user", "a", SenderIn{ID: self, Kind: "user"}},
		{"another key of the transport naming it", "a2", SenderIn{ID: self}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := g.decide(tc.key, id, DecisionRequest{Option: "approve", ArgsDigest: a.ArgsDigest, Decider: tc.decider})
			var p Problem
			if err := json.Unmarshal(body, &p); err != nil || status != http.StatusForbidden || p.Code != schemas.CodeDeciderNotAuthorized {
				t.Fatalf("%d %s, want 403 %s", status, body, schemas.CodeDeciderNotAuthorized)
			}
		})
	}
	if r := g.Approval(id); r.Status != schemas.ApprovalPending || len(r.Votes) != 0 {
		t.Fatalf("approval %s with votes %v, want pending with none", r.Status, r.Votes)
	}
	// Each 403 is the approver's rejection as the gateway's subscription
	// received it, which can be before the stream has stored it: wait for
	// the three in the stream, then check there is no fourth.
	rejected := 0
	jstest.Eventually(t, pipelinetest.Wait, "the three rejections stored", func() bool {
		rejected = 0
		for _, m := range g.Events(topology.SubjectDecisionRejected + ">") {
			if rej, err := schemas.Decode[schemas.DecisionRejected](m.Data); err == nil && rej.ApprovalID == id && rej.Code == schemas.CodeDeciderNotAuthorized {
				rejected++
			}
		}
		return rejected >= 3
	})
	if rejected != 3 {
		t.Fatalf("%d rejections of the key's decisions, want 3", rejected)
	}
	// A later fact: a person decides. Only then does the hook answer,
	// and it answers her decision.
	select {
	case d := <-done:
		t.Fatalf("the hook answered %+v before anyone allowed to decide did", d)
	default:
	}
	g.For(t).Decide(id, "deny", "alice")
	d := <-done
	if d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(schemas.CodeApprovalDenied)) {
		t.Fatalf("hook %+v, want deny %s", d, schemas.CodeApprovalDenied)
	}
	if r := g.Approval(id); r.Status != schemas.ApprovalDenied || r.Decision.Principal != "cli:alice" {
		t.Fatalf("approval %s by %+v, want denied by cli:alice", r.Status, r.Decision)
	}
}

// TestDecisionIdempotencyKeysAreScopedByKeyAndApproval: two keys of one
// transport send the same Idempotency-Key on decisions of two approvals,
// and one key sends it again on a third: each is its own decision and is
// applied. A retry of an applied decision answers its verdict (200, the
// approval's status and decision) rather than "submitted"; the same
// Idempotency-Key with another option on that approval is 409
// IDEMPOTENCY_KEY_REUSED. Nothing is published for either.
func TestDecisionIdempotencyKeysAreScopedByKeyAndApproval(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	var ids []string
	for _, s := range []string{"s-i1", "s-i2", "s-i3"} {
		_, c := g.submitGated("a", s, "alice")
		ids = append(ids, c.ApprovalID)
	}
	approve := func(key, id string) (*http.Response, []byte) {
		return g.do("POST", "/v1/approvals/"+id+"/decisions", key,
			DecisionRequest{Option: "approve", ArgsDigest: g.Approval(id).ArgsDigest, Decider: SenderIn{ID: "alice"}},
			"Idempotency-Key", "same")
	}
	first := map[string]DecisionResponse{}
	for i, key := range []string{"a", "a2", "a"} {
		resp, body := approve(key, ids[i])
		d := want[DecisionResponse](t, resp, body, http.StatusOK)
		if d.Status != string(schemas.ApprovalApproved) || d.Decision == nil || d.Decision.DecisionID != d.DecisionID {
			t.Fatalf("decision %d by key %s: %+v, want approved by it", i, key, d)
		}
		if a := g.Approval(ids[i]); a.Status != schemas.ApprovalApproved {
			t.Fatalf("approval %d: %s, want approved", i, a.Status)
		}
		first[ids[i]] = d
	}
	if first[ids[0]].DecisionID == first[ids[1]].DecisionID || first[ids[0]].DecisionID == first[ids[2]].DecisionID {
		t.Fatalf("decision ids %+v: want one per key and approval", first)
	}
	published := g.count(topology.StreamDecisions, ">")
	resp, body := approve("a", ids[0])
	d := want[DecisionResponse](t, resp, body, http.StatusOK)
	if d.DecisionID != first[ids[0]].DecisionID || d.Status != string(schemas.ApprovalApproved) || d.Decision == nil || *d.Decision != *first[ids[0]].Decision {
		t.Fatalf("retry answered %+v, want the applied verdict %+v", d, first[ids[0]])
	}
	resp, body = g.do("POST", "/v1/approvals/"+ids[0]+"/decisions", "a",
		DecisionRequest{Option: "deny", ArgsDigest: g.Approval(ids[0]).ArgsDigest, Decider: SenderIn{ID: "alice"}},
		"Idempotency-Key", "same")
	wantProblem(t, resp, body, http.StatusConflict, CodeIdempotencyKeyReused)
	if n := g.count(topology.StreamDecisions, ">"); n != published {
		t.Fatalf("%d decisions stored after the retries, want %d", n, published)
	}
}

// TestAGrantOptionIsADocumentedDecision: a decision choosing a grant option
// the approval offers is accepted (200, approved), and its request is one
// the OpenAPI document allows (checkContract validates the request body of
// every accepted request against DecisionRequest).
func TestAGrantOptionIsADocumentedDecision(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Policy: `{
	  "version": "grant-option",
	  "default_approval": "required",
	  "tools": {"write_file": {"approval": "required", "grants": [{"option": "approve-session", "scope": "session", "for": "1h"}]}}
	}`}, nil)
	_, c := g.submitGated("a", "s-grant", "alice")
	a := g.Approval(c.ApprovalID)
	if !a.Offers("approve-session") {
		t.Fatalf("options %v, want approve-session offered", a.Options)
	}
	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve-session", ArgsDigest: a.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	d := want[DecisionResponse](t, resp, body, http.StatusOK)
	if d.Status != string(schemas.ApprovalApproved) || d.Decision == nil || d.Decision.Option != "approve-session" {
		t.Fatalf("decision %+v, want approved with approve-session", d)
	}
}

// TestTheDecisionNoteIsInTheApprovalView: a deny sent with a note (its
// reason) through the API keeps it with the decision: the decision's
// answer and GET /v1/approvals/{id} show it as sent.
func TestTheDecisionNoteIsInTheApprovalView(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	_, c := g.submitGated("a", "s-note", "alice")
	const note = "wrong file: use notes/b.txt"
	resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "deny", ArgsDigest: g.Approval(c.ApprovalID).ArgsDigest, Decider: SenderIn{ID: "alice"}, Note: note})
	d := want[DecisionResponse](t, resp, body, http.StatusOK)
	if d.Decision == nil || d.Decision.Note != note {
		t.Fatalf("decision answered %+v, want the note %q", d.Decision, note)
	}
	resp, body = g.do("GET", "/v1/approvals/"+c.ApprovalID, "a", nil)
	v := want[ApprovalView](t, resp, body, http.StatusOK)
	if v.Decision == nil || v.Decision.Note != note || !strings.Contains(string(body), `"note":"`+note+`"`) {
		t.Fatalf("approval view %s, want decision.note %q", body, note)
	}
}

// TestTheApprovalViewShowsThePreview: a pending write_file approval's view
// (as submitted and from GET /v1/approvals/{id}) carries the preview taken
// when it was created: a new file, its content, its summary, as of when.
// The contract test checks the shape against openapi.json.
func TestTheApprovalViewShowsThePreview(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	_, c := g.submitGated("a", "s-preview", "alice")
	resp, body := g.do("GET", "/v1/approvals/"+c.ApprovalID, "a", nil)
	v := want[ApprovalView](t, resp, body, http.StatusOK)
	p := v.Preview
	if p == nil || p.Status != schemas.PreviewOK || p.Kind != schemas.PreviewKindNewFile || p.Text != "a" || p.TextVisible != "a" ||
		p.Flagged || p.Summary != "new file, 1 line" || p.At.IsZero() {
		t.Fatalf("approval view %s, want a new-file preview of a.txt", body)
	}
	if c.Approval.Preview == nil || c.Approval.Preview.Text != "a" {
		t.Fatalf("submit answered the approval %+v, want it with its preview", c.Approval)
	}
}

// TestADecisionIsAnsweredOnlyWithItsOwnVerdict races an approve and a deny
// of the same person on each of 100 approvals through the real decide
// endpoint (two keys of one transport, ten pairs at a time). Exactly one
// of each pair is applied and answered 200 with its own decision (its
// decision id and option, the approval's status that option gives); the
// other is answered 409 APPROVAL_ALREADY_DECIDED, never 200 with the
// winner's decision (docs/api.md "Decide"). Then the same with an
// approver that publishes no decided event for a decision it applies
// (issue 36): the answers come from the approval records, where the write
// of the decision that lost its compare-and-set is heard too and must not
// be taken for the verdict.
func TestADecisionIsAnsweredOnlyWithItsOwnVerdict(t *testing.T) {
	t.Run("the approver as a pipeline stage", func(t *testing.T) {
		g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.Rate, c.Burst = 10000, 10000 })
		raceDecisions(t, g, 100)
	})
	t.Run("the approver run on its own", func(t *testing.T) {
		g := startGateway(t, pipelinetest.Options{Stages: withoutApprover}, func(c *Config) { c.Rate, c.Burst = 10000, 10000 })
		g.H.RunApprover()
		raceDecisions(t, g, 100)
	})
}

// raceDecisions races an approve (key a) and a deny (key a2) of alice on
// each of pairs approvals (TestADecisionIsAnsweredOnlyWithItsOwnVerdict).
func raceDecisions(t *testing.T, g *gw, pairs int) {
	calls := make([]CallView, pairs)
	for i := range calls {
		_, calls[i] = g.submitGated("a", fmt.Sprintf("s-race-%d", i), "alice")
	}
	type answer struct {
		option string
		status int
		body   []byte
	}
	post := func(key, option string, c CallView) answer {
		b, _ := json.Marshal(DecisionRequest{Option: option, ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
		req, _ := http.NewRequest("POST", g.url+"/v1/approvals/"+c.ApprovalID+"/decisions", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+g.tokens[key])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{option: option, body: []byte(err.Error())}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return answer{option, resp.StatusCode, body}
	}
	results := make([][2]answer, pairs)
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			var pair sync.WaitGroup
			pair.Add(2)
			go func() { defer pair.Done(); results[i][0] = post("a", "approve", c) }()
			go func() { defer pair.Done(); results[i][1] = post("a2", "deny", c) }()
			pair.Wait()
		}()
	}
	wg.Wait()
	foreign, lost := 0, 0
	for i, pair := range results {
		applied := 0
		for _, a := range pair {
			switch a.status {
			case http.StatusOK:
				var d DecisionResponse
				if err := json.Unmarshal(a.body, &d); err != nil {
					t.Fatalf("approval %s: %s: %v", calls[i].ApprovalID, a.body, err)
				}
				status := map[string]schemas.ApprovalStatus{"approve": schemas.ApprovalApproved, "deny": schemas.ApprovalDenied}[a.option]
				if d.Decision == nil || d.Decision.DecisionID != d.DecisionID || d.Decision.Option != a.option || d.Status != string(status) {
					foreign++
					t.Errorf("approval %s: %s answered %s", calls[i].ApprovalID, a.option, a.body)
					continue
				}
				applied++
			case http.StatusConflict:
				var p Problem
				if err := json.Unmarshal(a.body, &p); err != nil || p.Code != schemas.CodeApprovalAlreadyDecided {
					t.Errorf("approval %s: %s answered 409 %s, want %s", calls[i].ApprovalID, a.option, a.body, schemas.CodeApprovalAlreadyDecided)
				}
			default:
				t.Errorf("approval %s: %s answered %d %s", calls[i].ApprovalID, a.option, a.status, a.body)
			}
		}
		if applied != 1 {
			lost++
		}
		// The one applied is the one the record holds.
		rec := g.Approval(calls[i].ApprovalID)
		for _, a := range pair {
			if a.status == http.StatusOK && (rec.Decision == nil || rec.Decision.Option != a.option) {
				t.Errorf("approval %s: %s answered 200, record holds %+v", calls[i].ApprovalID, a.option, rec.Decision)
			}
		}
	}
	if foreign != 0 || lost != 0 {
		t.Fatalf("%d of %d pairs: %d answers with the other decision's verdict, %d pairs without exactly one applied", pairs, pairs, foreign, lost)
	}
}

// A repeated identical decision (the same person, the same option, a new
// request without an Idempotency-Key) is an idempotent success: it is
// answered 200 with the approval's status, as the approver announces it
// again under the first decision; the same person's other option is 409
// APPROVAL_ALREADY_DECIDED (docs/security.md rule 5).
func TestARepeatedIdenticalDecisionIsAnsweredAsApplied(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	_, c := g.submitGated("a", "s-repeat", "alice")
	post := func(option string) (int, []byte) {
		b, _ := json.Marshal(DecisionRequest{Option: option, ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
		req, _ := http.NewRequest("POST", g.url+"/v1/approvals/"+c.ApprovalID+"/decisions", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+g.tokens["a"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	var first DecisionResponse
	for i, name := range []string{"the decision", "its repeat"} {
		status, body := post("approve")
		var d DecisionResponse
		if status != http.StatusOK || json.Unmarshal(body, &d) != nil || d.Status != string(schemas.ApprovalApproved) || d.Decision == nil {
			t.Fatalf("%s: %d %s, want 200 approved", name, status, body)
		}
		if i == 0 {
			first = d
			continue
		}
		if d.DecisionID == first.DecisionID || d.Decision.DecisionID != first.DecisionID {
			t.Errorf("the repeat answered %+v: want its own decision id, and the first decision as the one recorded (%s)", d, first.DecisionID)
		}
	}
	status, body := post("deny")
	var p Problem
	if status != http.StatusConflict || json.Unmarshal(body, &p) != nil || p.Code != schemas.CodeApprovalAlreadyDecided {
		t.Errorf("deny after approve: %d %s, want 409 %s", status, body, schemas.CodeApprovalAlreadyDecided)
	}
}

// twoDeciders lets the requester (alice) and bob decide write_file.
const twoDeciders = `{
  "version": "two-deciders",
  "default_approval": "required",
  "deciders": {"principals": ["gateway:bob"]},
  "tools": {"write_file": {"approval": "required"}}
}`

// The same outcome from another authorized decider is an idempotent
// success too (protocol §9.2): answered 200 at once with the approval's
// status and the decision recorded first, whose id is not the request's;
// never 202 after the wait. The other outcome is 409. Then the same, with
// both deciders approving at once: one is applied, the other answered as
// its repeat, none left without an answer.
func TestAnotherDecidersSameOutcomeIsAnsweredAsApplied(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Policy: twoDeciders}, func(c *Config) {
		c.Rate, c.Burst, c.DecisionWait = 10000, 10000, jstest.Scale(20*time.Second)
	})
	decide := func(c CallView, who, option string) (int, DecisionResponse, []byte) {
		t.Helper()
		resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
			DecisionRequest{Option: option, ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: who}})
		var d DecisionResponse
		_ = json.Unmarshal(body, &d)
		return resp.StatusCode, d, body
	}
	_, c := g.submitGated("a", "s-two", "alice")
	code, first, body := decide(c, "alice", "approve")
	if code != http.StatusOK || first.Decision == nil || first.Decision.DecisionID != first.DecisionID {
		t.Fatalf("alice's approve: %d %s", code, body)
	}
	start := time.Now()
	code, again, body := decide(c, "bob", "approve")
	if code != http.StatusOK || again.Status != string(schemas.ApprovalApproved) || again.Decision == nil ||
		again.Decision.DecisionID != first.DecisionID || again.Decision.Principal != "gateway:alice" || again.DecisionID == first.DecisionID {
		t.Fatalf("bob's approve after alice's: %d %s (after %v); want 200 approved with alice's decision", code, body, time.Since(start))
	}
	if code, _, body := decide(c, "bob", "deny"); code != http.StatusConflict || !strings.Contains(string(body), string(schemas.CodeApprovalAlreadyDecided)) {
		t.Fatalf("bob's deny after alice's approve: %d %s, want 409 %s", code, body, schemas.CodeApprovalAlreadyDecided)
	}

	const pairs = 20
	calls := make([]CallView, pairs)
	for i := range calls {
		_, calls[i] = g.submitGated("a", fmt.Sprintf("s-both-%d", i), "alice")
	}
	type answer struct {
		code int
		d    DecisionResponse
		body []byte
	}
	results := make([][2]answer, pairs)
	var wg sync.WaitGroup
	for i, c := range calls {
		for j, who := range []string{"alice", "bob"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, d, body := decide(c, who, "approve")
				results[i][j] = answer{code, d, body}
			}()
		}
	}
	wg.Wait()
	for i, pair := range results {
		applied := 0
		for _, a := range pair {
			if a.code != http.StatusOK || a.d.Decision == nil || a.d.Status != string(schemas.ApprovalApproved) {
				t.Errorf("approval %s: an approve answered %d %s, want 200 approved", calls[i].ApprovalID, a.code, a.body)
				continue
			}
			if a.d.Decision.DecisionID == a.d.DecisionID {
				applied++
			}
		}
		rec := g.Approval(calls[i].ApprovalID)
		if applied != 1 || rec.Decision == nil || (rec.Decision.DecisionID != pair[0].d.DecisionID && rec.Decision.DecisionID != pair[1].d.DecisionID) {
			t.Errorf("approval %s: %d answers name their own decision as applied, record holds %+v; want exactly one, the record's", calls[i].ApprovalID, applied, rec.Decision)
		}
	}
}

// withoutApprover are the stages a test runs when it runs its own approver.
var withoutApprover = []string{pipelinetest.Ingest, pipelinetest.Executor, pipelinetest.Redriver}

// turnApproval is the approval of call 0 of turn as GET /v1/turns shows it.
func (g *gw) turnApproval(turn string) *ApprovalView {
	g.t.Helper()
	resp, body := g.do("GET", "/v1/turns/"+turn, "a", nil)
	v := want[TurnView](g.t, resp, body, http.StatusOK)
	if len(v.Calls) == 0 || v.Calls[0].Approval == nil {
		g.t.Fatalf("turn %s: no approval in %s", turn, body)
	}
	return v.Calls[0].Approval
}

// TestADecisionIsAnsweredByTheRecordWithoutADecidedEvent: the approver
// publishes no approval.decided event for a decision it applies (only for
// a repeat, with Repeat set: issue 36). A decision posted is answered 200
// from the approval record's revision, with its own decision id, and the
// turn's view shows it decided. Repeats, answered by the approver's
// announcement only (they change no record): bob's approve is 200 with
// alice's decision, recorded first, and alice's approve again too; bob's
// deny is 409 APPROVAL_ALREADY_DECIDED.
func TestADecisionIsAnsweredByTheRecordWithoutADecidedEvent(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Policy: twoDeciders, Stages: withoutApprover}, func(c *Config) {
		c.DecisionWait = jstest.Scale(20 * time.Second)
	})
	g.H.RunApprover()
	sub, c := g.submitGated("a", "s-record", "alice")
	decide := func(who, option string) (*http.Response, []byte) {
		t.Helper()
		return g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
			DecisionRequest{Option: option, ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: who}})
	}

	resp, body := decide("alice", "approve")
	first := want[DecisionResponse](t, resp, body, http.StatusOK)
	rec := g.Approval(c.ApprovalID)
	if first.Status != string(schemas.ApprovalApproved) || first.Decision == nil || first.Decision.DecisionID != first.DecisionID ||
		rec.Decision == nil || rec.Decision.DecisionID != first.DecisionID {
		t.Fatalf("alice's approve answered %s; record %s by %+v", body, rec.Status, rec.Decision)
	}
	for _, ev := range g.Decided(sub.TurnID) {
		if ev.Repeat == "" {
			t.Fatalf("an approval.decided event without Repeat was published: %+v", ev)
		}
	}
	if a := g.turnApproval(sub.TurnID); a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.DecisionID != first.DecisionID {
		t.Fatalf("the turn's view shows its approval %s by %+v, want approved by %s", a.Status, a.Decision, first.DecisionID)
	}

	for _, who := range []string{"bob", "alice"} {
		resp, body := decide(who, "approve")
		again := want[DecisionResponse](t, resp, body, http.StatusOK)
		if again.Status != string(schemas.ApprovalApproved) || again.Decision == nil || again.Decision.DecisionID != first.DecisionID || again.DecisionID == first.DecisionID {
			t.Fatalf("%s's approve after alice's: %s; want 200 approved with alice's decision %s", who, body, first.DecisionID)
		}
	}
	resp, body = decide("bob", "deny")
	wantProblem(t, resp, body, http.StatusConflict, schemas.CodeApprovalAlreadyDecided)
}

// TestADecisionIsNotAnsweredByAWriteNeverStored: a core subscription to
// the approval record's subject hears every write sent there, a
// compare-and-set that lost included, which the bucket never stores.
// While alice's approve waits, such a write arrives holding the approval
// approved by her (an answer to her decision, were it stored); then bob's
// deny, stored before her approve, is applied. The request is answered
// 409 APPROVAL_ALREADY_DECIDED, never 200; the turn's view shows the
// approval denied by bob.
func TestADecisionIsNotAnsweredByAWriteNeverStored(t *testing.T) {
	for _, tc := range []struct {
		name        string
		repeatsOnly bool
	}{{"the approver as a pipeline stage", false}, {"the approver run on its own", true}} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, pipelinetest.Options{Policy: twoDeciders, Stages: withoutApprover}, func(c *Config) {
				c.DecisionWait = jstest.Scale(20 * time.Second)
			})
			sub, c := g.submitGated("a", "s-lost", "alice")
			pending := g.Approval(c.ApprovalID)
			deny := g.Decision(c.ApprovalID, "deny", "gateway", "bob")
			g.Submit(deny)

			type answer struct {
				resp *http.Response
				body []byte
			}
			done := make(chan answer, 1)
			go func() {
				resp, body := g.do("POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "a",
					DecisionRequest{Option: "approve", ArgsDigest: c.ArgsDigest, Decider: SenderIn{ID: "alice"}})
				done <- answer{resp, body}
			}()
			jstest.Eventually(t, pipelinetest.Wait, "alice's approve stored after bob's deny", func() bool {
				return g.count(topology.StreamDecisions, topology.DecisionSubject("gateway", c.ApprovalID)) == 2
			})
			g.ForgeLostWrite(pending, schemas.ApprovalApproved,
				&schemas.DecisionInfo{DecisionID: "d-lost", Principal: "gateway:alice", Option: "approve", DecidedAt: time.Now().UTC()})
			if tc.repeatsOnly {
				g.H.RunApprover()
			} else {
				pipelinetest.Start(t, pipelinetest.Options{Env: g.Env, Keys: g.Keys, Policy: twoDeciders, Stages: []string{pipelinetest.Approver}})
			}

			a := <-done
			wantProblem(t, a.resp, a.body, http.StatusConflict, schemas.CodeApprovalAlreadyDecided)
			if rec := g.Approval(c.ApprovalID); rec.Status != schemas.ApprovalDenied || rec.Decision.DecisionID != deny.DecisionID {
				t.Fatalf("approval %s by %+v, want denied by %s", rec.Status, rec.Decision, deny.DecisionID)
			}
			if v := g.turnApproval(sub.TurnID); v.Status != schemas.ApprovalDenied || v.Decision == nil || v.Decision.DecisionID != deny.DecisionID {
				t.Fatalf("the turn's view shows its approval %s by %+v, want denied by %s", v.Status, v.Decision, deny.DecisionID)
			}
		})
	}
}
