package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// JetStream names the test inspects directly (see docs/protocol.md).
const (
	streamEvents    = "TOLLGATE_EVENTS"
	streamTurns     = "TOLLGATE_TURNS"
	streamDLQ       = "TOLLGATE_DLQ"
	bucketClaims    = "tollgate_claims"
	bucketBatches   = "tollgate_batches"
	consumerExec    = "executor"
	consumerRedrive = "redriver"
)

// TestEndToEnd builds the binaries, runs nats-server and the four stages as
// separate processes, and drives turns through the tollgate CLI.
func TestEndToEnd(t *testing.T) {
	start := time.Now()
	bin := buildBinaries(t)
	c := newCluster(t, bin)
	t.Logf("cluster up at %s after %v", c.url, time.Since(start).Round(time.Millisecond))

	t.Run("fast_path", c.testFastPath)
	t.Run("approve", c.testApprove)
	t.Run("unauthorized_then_deny", c.testUnauthorizedThenDeny)
	t.Run("no_interactive_requester", c.testNoInteractiveRequester)
	t.Run("redriver_killed_while_waiting", c.testRedriverKilled)
	t.Run("nats_server_killed_while_waiting", c.testNATSKilled)
	t.Run("malformed_inbound_dead_lettered", c.testMalformedInbound)

	// No worker crashed along the way (the redriver was restarted on purpose).
	for _, s := range []string{"ingest", "executor", "approver", "redriver"} {
		if p := c.stage(s); p.Exited() {
			t.Errorf("stage %s exited during the test: %v", s, p.Err())
		}
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

// send publishes a turn through the CLI and returns its turn id.
func (c *cluster) send(t *testing.T, session string, calls ...string) string {
	t.Helper()
	args := []string{"send", "--session", session, "--sender", "alice", "--text", "e2e " + session}
	for _, call := range calls {
		args = append(args, "--call", call)
	}
	var out struct {
		TurnID    string `json:"turn_id"`
		SessionID string `json:"session_id"`
	}
	c.cliJSON(t, 0, &out, args...)
	if !strings.HasPrefix(out.TurnID, "t-") || out.SessionID != session {
		t.Fatalf("send: turn %q session %q", out.TurnID, out.SessionID)
	}
	return out.TurnID
}

// batch is the --json shape of `tollgate outcome`.
type batch struct {
	TurnID    string    `json:"turn_id"`
	SessionID string    `json:"session_id"`
	State     string    `json:"state"`
	Code      string    `json:"code"`
	Approvals []string  `json:"approvals"`
	Results   []*result `json:"results"`
	Calls     []struct {
		CallID string `json:"call_id"`
		Tool   string `json:"tool"`
	} `json:"calls"`
	Context struct {
		TurnID    string `json:"turn_id"`
		Requester struct {
			Principal string `json:"principal"`
		} `json:"requester"`
	} `json:"context"`
}

type result struct {
	CallID     string `json:"call_id"`
	Tool       string `json:"tool"`
	Status     string `json:"status"`
	Output     string `json:"output"`
	Code       string `json:"code"`
	Reason     string `json:"reason"`
	ApprovalID string `json:"approval_id"`
}

// outcome runs `tollgate outcome TURN --json`, waiting up to wait for a
// terminal state when wait > 0.
func (c *cluster) outcome(t *testing.T, turn string, wait time.Duration) batch {
	t.Helper()
	args := []string{"outcome", turn}
	if wait > 0 {
		args = append(args, "--wait", wait.String())
	}
	var b batch
	r := c.runCLI(t, append(args, "--json")...)
	if r.code != 0 {
		t.Fatalf("outcome: want exit status 0\n%s", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &b); err != nil {
		t.Fatalf("outcome: %v\n%s", err, r)
	}
	if b.TurnID != turn {
		t.Fatalf("outcome: turn %q, want %q\n%s", b.TurnID, turn, r)
	}
	return b
}

// approval is the --json shape of one `tollgate pending` entry.
type approval struct {
	ApprovalID string   `json:"approval_id"`
	TurnID     string   `json:"turn_id"`
	SessionID  string   `json:"session_id"`
	CallID     string   `json:"call_id"`
	Tool       string   `json:"tool"`
	Args       string   `json:"args"`
	ArgsDigest string   `json:"args_digest"`
	Options    []string `json:"options"`
	Status     string   `json:"status"`
	Context    struct {
		TurnID    string `json:"turn_id"`
		Requester struct {
			Principal string `json:"principal"`
		} `json:"requester"`
	} `json:"context"`
}

// pendingFor polls `tollgate pending --json` until the turn's approvals
// appear and returns them.
func (c *cluster) pendingFor(t *testing.T, session, turn string, n int) []approval {
	t.Helper()
	var got []approval
	jstest.EventuallyState(t, jstest.Wait, fmt.Sprintf("%d pending approval(s) of %s", n, turn), func() (bool, string) {
		var all []approval
		c.cliJSON(t, 0, &all, "pending", "--session", session)
		got = got[:0]
		for _, a := range all {
			if a.TurnID == turn {
				got = append(got, a)
			}
		}
		return len(got) == n, fmt.Sprintf("%d listed for the turn, %d for the session", len(got), len(all))
	})
	return got
}

// decision is the --json output of approve/deny: a decided event or a
// rejection.
type decision struct {
	ApprovalID string `json:"approval_id"`
	TurnID     string `json:"turn_id"`
	Status     string `json:"status"`
	Code       string `json:"code"`
	Principal  string `json:"principal"`
	Decision   struct {
		Principal string `json:"principal"`
		Option    string `json:"option"`
	} `json:"decision"`
}

func (c *cluster) decide(t *testing.T, option, id, as string, wantExit int) decision {
	t.Helper()
	var d decision
	c.cliJSON(t, wantExit, &d, option, id, "--as", as)
	if d.ApprovalID != id {
		t.Fatalf("%s %s: answer is about approval %q", option, id, d.ApprovalID)
	}
	return d
}

func checkApproval(t *testing.T, a approval, turn, tool string, args map[string]string) {
	t.Helper()
	if a.Tool != tool || a.Status != "pending" || a.Context.TurnID != turn || a.Context.Requester.Principal != "cli:alice" {
		t.Errorf("approval %s: tool %q status %q context turn %q requester %q; want %s pending %s cli:alice",
			a.ApprovalID, a.Tool, a.Status, a.Context.TurnID, a.Context.Requester.Principal, tool, turn)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(a.Args), &got); err != nil || !reflect.DeepEqual(got, args) {
		t.Errorf("approval %s: args %s (%v), want %v", a.ApprovalID, a.Args, err, args)
	}
	if !reflect.DeepEqual(a.Options, []string{"approve", "deny"}) {
		t.Errorf("approval %s: options %v, want [approve deny]", a.ApprovalID, a.Options)
	}
	if !strings.HasPrefix(a.ArgsDigest, "sha256:") || a.ApprovalID == "" || !strings.HasPrefix(a.CallID, turn+"-") {
		t.Errorf("approval %+v: want an id, a sha256 digest and a call of the turn", a)
	}
}

func noFile(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s exists (or cannot be checked: %v) but the call was not approved", path, err)
	}
}

func fileIs(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("side effect: %v", err)
	}
	if string(b) != want {
		t.Fatalf("%s holds %q, want %q", path, b, want)
	}
}

func (c *cluster) testFastPath(t *testing.T) {
	text := "hello " + nonce(t)
	turn := c.send(t, "e2e-fast", callArg(t, "echo", map[string]string{"text": text}))
	b := c.outcome(t, turn, 20*time.Second)
	if b.State != "completed" || len(b.Results) != 1 || b.Results[0] == nil {
		t.Fatalf("fast path: state %q results %d, want completed with 1 result", b.State, len(b.Results))
	}
	if r := b.Results[0]; r.Status != "ok" || r.Output != text || r.Tool != "echo" || r.ApprovalID != "" {
		t.Fatalf("fast path result %+v: want ok %q from echo without approval", r, text)
	}
	if b.Context.Requester.Principal != "cli:alice" || b.Context.TurnID != turn {
		t.Errorf("fast path: persisted context %+v, want requester cli:alice of %s", b.Context, turn)
	}
	if n := c.toolRuns(turn + "-0"); n != 1 {
		t.Errorf("echo ran %d times, want 1 (counted from the stages' \"tool ran\" log lines)", n)
	}
	// The ingest stage serves its per-stage counters.
	v, found, body := c.metric(t, "ingest", "tollgate_messages_received_total", `stage="ingest"`)
	if !found || v < 1 {
		t.Errorf("ingest /metrics: tollgate_messages_received_total{stage=\"ingest\"} = %v (found %v), want >= 1\n%s", v, found, body)
	}
}

func (c *cluster) testApprove(t *testing.T) {
	n := nonce(t)
	session := "e2e-approve-" + n
	echoText := "before the approval " + n
	wargs := map[string]string{"path": "approved/" + n + ".txt", "content": "approved content " + n + "\n"}
	target := filepath.Join(c.sbox, wargs["path"])
	turn := c.send(t, session, callArg(t, "echo", map[string]string{"text": echoText}), callArg(t, "write_file", wargs))

	as := c.pendingFor(t, session, turn, 1)
	a := as[0]
	checkApproval(t, a, turn, "write_file", wargs)
	if a.CallID != turn+"-1" {
		t.Errorf("approval binds call %s, want %s-1", a.CallID, turn)
	}
	noFile(t, target)
	// The allowed call already ran; the batch waits for the approval.
	b := c.outcome(t, turn, 0)
	if b.State != "awaiting" || len(b.Results) != 2 || b.Results[0] == nil || b.Results[0].Output != echoText || b.Results[1] != nil {
		t.Fatalf("before approval: state %q results %+v, want awaiting with only the echo result", b.State, b.Results)
	}
	if len(b.Approvals) != 2 || b.Approvals[0] != "" || b.Approvals[1] != a.ApprovalID {
		t.Errorf("batch approvals %q, want [\"\" %q]", b.Approvals, a.ApprovalID)
	}

	d := c.decide(t, "approve", a.ApprovalID, "alice", 0)
	if d.Status != "approved" || d.TurnID != turn || d.Decision.Principal != "cli:alice" || d.Decision.Option != "approve" {
		t.Fatalf("approve: %+v, want approved by cli:alice for %s", d, turn)
	}
	b = c.outcome(t, turn, 20*time.Second)
	if b.State != "completed" || len(b.Results) != 2 || b.Results[0] == nil || b.Results[1] == nil {
		t.Fatalf("after approval: state %q results %+v, want completed with 2 results", b.State, b.Results)
	}
	if r := b.Results[0]; r.Status != "ok" || r.Output != echoText || r.Tool != "echo" {
		t.Errorf("echo result %+v", r)
	}
	if r := b.Results[1]; r.Status != "ok" || r.Tool != "write_file" || r.ApprovalID != a.ApprovalID || !strings.Contains(r.Output, wargs["path"]) {
		t.Errorf("write_file result %+v, want ok under approval %s", r, a.ApprovalID)
	}
	fileIs(t, target, wargs["content"])

	// A repeated identical decision is an idempotent success; a conflicting
	// one is rejected. Neither runs the tool again.
	if d := c.decide(t, "approve", a.ApprovalID, "alice", 0); d.Status != "approved" {
		t.Errorf("repeated approve: %+v, want approved (idempotent)", d)
	}
	if d := c.decide(t, "deny", a.ApprovalID, "alice", 1); d.Code != "APPROVAL_ALREADY_DECIDED" {
		t.Errorf("deny after approve: %+v, want APPROVAL_ALREADY_DECIDED", d)
	}
	c.waitIdle(t, streamEvents, consumerRedrive)
	if n := c.toolRuns(a.CallID); n != 1 {
		t.Errorf("write_file of %s ran %d times, want exactly 1", a.CallID, n)
	}
	if b2 := c.outcome(t, turn, 0); b2.State != "completed" || b2.Results[1].Status != "ok" {
		t.Errorf("after the repeated decisions: %+v", b2)
	}
	fileIs(t, target, wargs["content"])
}

func (c *cluster) testUnauthorizedThenDeny(t *testing.T) {
	n := nonce(t)
	session := "e2e-deny-" + n
	wargs := map[string]string{"path": "denied/" + n + ".txt", "content": "must not be written " + n}
	target := filepath.Join(c.sbox, wargs["path"])
	turn := c.send(t, session, callArg(t, "write_file", wargs))
	a := c.pendingFor(t, session, turn, 1)[0]
	checkApproval(t, a, turn, "write_file", wargs)

	// Someone who is neither the requester nor a policy approver.
	d := c.decide(t, "approve", a.ApprovalID, "mallory", 1)
	if d.Code != "DECIDER_NOT_AUTHORIZED" || d.Principal != "cli:mallory" {
		t.Fatalf("approve as mallory: %+v, want DECIDER_NOT_AUTHORIZED for cli:mallory", d)
	}
	still := c.pendingFor(t, session, turn, 1)[0]
	if still.ApprovalID != a.ApprovalID || still.Status != "pending" {
		t.Fatalf("after mallory's attempt: %+v, want %s still pending", still, a.ApprovalID)
	}
	if b := c.outcome(t, turn, 0); b.State != "awaiting" {
		t.Fatalf("after mallory's attempt the batch is %q, want awaiting", b.State)
	}
	noFile(t, target)

	d = c.decide(t, "deny", a.ApprovalID, "alice", 0)
	if d.Status != "denied" || d.Decision.Principal != "cli:alice" {
		t.Fatalf("deny: %+v, want denied by cli:alice", d)
	}
	b := c.outcome(t, turn, 20*time.Second)
	if b.State != "completed" || len(b.Results) != 1 || b.Results[0] == nil {
		t.Fatalf("denied turn: state %q results %+v, want completed with 1 result", b.State, b.Results)
	}
	if r := b.Results[0]; r.Status != "denied" || r.Code != "APPROVAL_DENIED" || r.ApprovalID != a.ApprovalID {
		t.Fatalf("denied result %+v, want denied APPROVAL_DENIED", r)
	}
	c.waitIdle(t, streamEvents, consumerRedrive)
	noFile(t, target)
	if n := c.toolRuns(a.CallID); n != 0 {
		t.Errorf("denied write_file ran %d times", n)
	}
}

// A call that needs approval on a turn whose requester cannot answer a
// prompt (the built-in policy: transport webhook) fails at once, with no
// prompt.
func (c *cluster) testNoInteractiveRequester(t *testing.T) {
	n := nonce(t)
	session := "e2e-webhook-" + n
	wargs := map[string]string{"path": "webhook/" + n + ".txt", "content": "nobody can approve this " + n}
	var out struct {
		TurnID string `json:"turn_id"`
	}
	c.cliJSON(t, 0, &out, "send", "--transport", "webhook", "--session", session, "--sender", "hook", "--call", callArg(t, "write_file", wargs))
	turn := out.TurnID
	b := c.outcome(t, turn, 20*time.Second)
	if (b.State != "completed" && b.State != "failed") || len(b.Results) != 1 || b.Results[0] == nil {
		t.Fatalf("webhook turn: state %q results %+v, want a terminal batch with 1 result", b.State, b.Results)
	}
	if r := b.Results[0]; r.Status != "failed" || r.Code != "NO_INTERACTIVE_REQUESTER" || r.ApprovalID != "" {
		t.Errorf("webhook result %+v, want failed NO_INTERACTIVE_REQUESTER without an approval", r)
	}
	var all []approval
	c.cliJSON(t, 0, &all, "pending", "--session", session)
	if len(all) != 0 {
		t.Errorf("pending approvals for a turn nobody can answer: %+v", all)
	}
	if k := c.streamCount(t, streamEvents, "tollgate.event.approval.requested."+turn); k != 0 {
		t.Errorf("%d approval prompts emitted for a turn nobody can answer", k)
	}
	noFile(t, filepath.Join(c.sbox, wargs["path"]))
	if k := c.toolRuns(turn + "-0"); k != 0 {
		t.Errorf("write_file ran %d times without an approval", k)
	}
}

func (c *cluster) testRedriverKilled(t *testing.T) {
	n := nonce(t)
	session := "e2e-kill-" + n
	wargs := map[string]string{"path": "killed/" + n + ".txt", "content": "written once after a redriver crash " + n}
	target := filepath.Join(c.sbox, wargs["path"])
	turn := c.send(t, session, callArg(t, "write_file", wargs))
	a := c.pendingFor(t, session, turn, 1)[0]
	checkApproval(t, a, turn, "write_file", wargs)

	// The batch waits for its approval (its turn log's awaiting event)
	// before the redriver dies. The executor announces nothing: only the
	// decided event (or the redriver's recovery sweep) makes the redriver
	// look at a waiting batch, so the decision below, applied while it is
	// down, is what the restarted redriver must act on.
	jstest.EventuallyState(t, jstest.Wait, "the batch of "+turn+" awaiting", func() (bool, string) {
		evs := c.turnEvents(t, turn)
		return len(evs) > 0 && evs[len(evs)-1] == "awaiting", fmt.Sprintf("turn log events %v", evs)
	})
	old := c.stage("redriver")
	kill(t, old)

	// The approver is up: the decision is applied while the redriver is down.
	d := c.decide(t, "approve", a.ApprovalID, "alice", 0)
	if d.Status != "approved" {
		t.Fatalf("approve with the redriver down: %+v", d)
	}
	if b := c.outcome(t, turn, 0); b.State != "awaiting" {
		t.Fatalf("with the redriver down the batch is %q, want awaiting", b.State)
	}
	noFile(t, target)
	if evs := c.turnEvents(t, turn); slices.Contains(evs, "started") {
		t.Fatalf("turn log events %v with the redriver down, want no started", evs)
	}

	fresh := c.startStage(t, "redriver")
	b := c.outcome(t, turn, 20*time.Second)
	if b.State != "completed" || len(b.Results) != 1 || b.Results[0] == nil {
		t.Fatalf("after the restart: state %q results %+v, want completed with 1 result", b.State, b.Results)
	}
	if r := b.Results[0]; r.Status != "ok" || r.ApprovalID != a.ApprovalID || r.Tool != "write_file" {
		t.Fatalf("result %+v, want ok under %s", r, a.ApprovalID)
	}
	fileIs(t, target, wargs["content"])

	// Exactly once: let every stage settle, then count.
	c.waitIdle(t, streamEvents, consumerRedrive)
	c.waitIdle(t, streamTurns, consumerExec)
	if k := c.toolRuns(a.CallID); k != 1 {
		t.Errorf("write_file of %s ran %d times, want exactly 1", a.CallID, k)
	}
	if !strings.Contains(fresh.LogText(), `msg="tool ran" call=`+a.CallID+" ") {
		t.Errorf("the restarted redriver did not run %s", a.CallID)
	}

	// The execution claim was taken once, by the restarted redriver (the
	// batch record holds it, beside the one result checked above).
	claim := c.claim(t, turn, 0)
	host, _ := os.Hostname()
	wantWorker := "redriver@" + host + ":" + strconv.Itoa(fresh.Cmd.Process.Pid)
	worker, _ := claim["worker"].(string) // the engine adds "#<nonce>"
	if !strings.HasPrefix(worker, wantWorker+"#") || claim["claimed_at"] == nil {
		t.Errorf("claim of %s: %v; want one by worker %s", a.CallID, claim, wantWorker)
	}

	// The turn's log: the batch moved to started once (the restarted
	// redriver's start: its started event is the fact, no redrive outcome
	// is published for it), and ended (its outcome event; the record says
	// completed, checked above).
	evs := c.turnEvents(t, turn)
	moves, starts := 0, 0 // the batch's moves to another state, and to started
	for i, e := range evs {
		if i == 0 || evs[i-1] != e {
			moves++
			if e == "started" {
				starts++
			}
		}
	}
	if starts != 1 || evs[len(evs)-1] != topology.EventTurnOutcome {
		t.Errorf("turn log events %v: %d moves to started, want 1, and the outcome last", evs, starts)
	}

	// The turn's outcome is kept by the write that ended it (its log's
	// outcome event, checked last above), and published nowhere.
	if n := c.streamCount(t, streamEvents, topology.SubjectTurnOutcome+turn); n != 0 {
		t.Errorf("%d published outcomes of %s in %s, want none: its log's outcome event keeps it", n, turn, streamEvents)
	}

	// The event history of the turn as `tollgate watch` shows it: the
	// approval requested (after the log's awaiting event that keeps it)
	// and decided, from the turn's log each move of the batch (one to
	// started), and one outcome, which watch shows after the log's outcome
	// event that keeps it; no batch-awaiting notice and no redrive outcome
	// (the turn's log holds those facts).
	// Of the events stream's, watch shows a published request the log
	// keeps from the log instead (after the move to awaiting): the turn's
	// one request and its one outcome come from the log.
	// Its one decision is its approval record's revision, which watch
	// shows from the approvals bucket (no decided event is published).
	published := c.streamCount(t, streamEvents, "tollgate.event.approval.requested."+turn)
	total := int(c.streamCount(t, streamEvents, "tollgate.event.*.*."+turn)-published) + moves + 1 + 1 + 1
	count := map[string]int{}
	for _, ev := range c.watchEvents(t, turn, total) {
		subj, _ := ev["subject"].(string)
		kind := strings.TrimSuffix(strings.TrimPrefix(subj, "tollgate.event."), "."+turn)
		if i := strings.LastIndex(subj, "."+turn+"."); strings.HasPrefix(subj, "tollgate.turnlog.") && i >= 0 {
			kind = "turnlog." + subj[i+len(turn)+2:] // the batch's move to that state
		}
		count[kind]++
		body, _ := ev["event"].(map[string]any)
		if kind == "turn.outcome" {
			results, _ := body["results"].([]any)
			if body["state"] != "completed" || len(results) != 1 {
				t.Errorf("turn outcome event %v, want completed with 1 result", body)
			}
		}
	}
	want := map[string]int{"approval.requested": 1, "approval.decided": 1, "turn.outcome": 1,
		"turnlog.awaiting": 1, "turnlog.started": 1, "turnlog.outcome": 1}
	for k, v := range want {
		if count[k] != v {
			t.Errorf("%d %s events for %s, want %d (all: %v)", count[k], k, turn, v, count)
		}
	}
	for _, k := range []string{"batch.awaiting", "redrive.started", "redrive.failed"} {
		if count[k] != 0 {
			t.Errorf("%d %s events for %s, want none (all: %v)", count[k], k, turn, count)
		}
	}

	// The fresh redriver counted the one start (its metric still counts
	// starts, though no event is published for them).
	v, found, body := c.metric(t, "redriver", "tollgate_redrive_outcomes_total", `kind="started"`)
	if !found || v != 1 {
		t.Errorf("restarted redriver: tollgate_redrive_outcomes_total{kind=\"started\"} = %v (found %v), want 1\n%s", v, found, body)
	}
}

// A SIGKILL of nats-server while a batch waits for approval loses nothing:
// after the restart the stages reconnect on their own, the pending approval
// is still there, the decision applies, the call runs once, and new turns
// flow again.
func (c *cluster) testNATSKilled(t *testing.T) {
	n := nonce(t)
	session := "e2e-broker-" + n
	wargs := map[string]string{"path": "broker/" + n + ".txt", "content": "survived a broker crash " + n}
	target := filepath.Join(c.sbox, wargs["path"])
	turn := c.send(t, session, callArg(t, "write_file", wargs))
	a := c.pendingFor(t, session, turn, 1)[0]

	c.restartNATS(t)

	if got := c.pendingFor(t, session, turn, 1)[0]; got.ApprovalID != a.ApprovalID {
		t.Fatalf("after the restart the pending approval is %+v, want %s", got, a.ApprovalID)
	}
	d := c.decide(t, "approve", a.ApprovalID, "alice", 0)
	if d.Status != "approved" {
		t.Fatalf("approve after the broker restart: %+v", d)
	}
	b := c.outcome(t, turn, 30*time.Second)
	if b.State != "completed" || len(b.Results) != 1 || b.Results[0] == nil || b.Results[0].Status != "ok" {
		t.Fatalf("after the broker restart: %+v, want completed with an ok result", b)
	}
	fileIs(t, target, wargs["content"])

	// A turn sent after the restart flows through every stage.
	later := c.send(t, session+"-later", `echo={"text":"after the restart"}`)
	if lb := c.outcome(t, later, 30*time.Second); lb.State != "completed" {
		t.Fatalf("a turn sent after the broker restart: %+v", lb)
	}
	// No waitIdle here: an ack sent while the broker was down is lost, and
	// that message comes back only after AckWait (30 s). Its redelivery
	// finds the batch terminal; at-most-once is the claims' job, tested
	// with concurrent and redelivered triggers in pipeline/redriver.
	if k := c.toolRuns(a.CallID); k != 1 {
		t.Errorf("write_file of %s ran %d times across the broker restart, want 1", a.CallID, k)
	}
}

// turnEvents returns the names of the events of turn's log in order (the
// states its batch was written in: queued, running, awaiting, started,
// completed...), read raw from the turn's partition of the turn logs.
func (c *cluster) turnEvents(t *testing.T, turn string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	logs, p := c.turnLog(ctx, t, turn)
	prefix := topology.TurnLogSubject(p, turn, "")
	var out []string
	for seq := uint64(1); ; {
		m, err := logs[p].GetMsg(ctx, seq, jetstream.WithGetMsgSubject(topology.TurnLogWildcard(p, turn)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatalf("turn log of %s in %s: %v", turn, topology.TurnLogStream(p), err)
		}
		out = append(out, strings.TrimPrefix(m.Subject, prefix))
		seq = m.Sequence + 1
	}
}

// turnLog opens the turn logs and names turn's partition among them.
func (c *cluster) turnLog(ctx context.Context, t *testing.T, turn string) ([]jetstream.Stream, int) {
	t.Helper()
	logs, err := topology.OpenTurnLogs(ctx, c.js)
	if err != nil {
		t.Fatalf("turn logs: %v", err)
	}
	return logs, topology.TurnLogPartition(turn, len(logs))
}

// claim returns the execution claim of call i of turn: an entry of the
// batch record's claims (docs/protocol.md, BatchRecord), read raw from the
// turn's log (its last event is the batch: jetstream/topology's turn
// logs, the partition the turn id's hash among as many as the streams
// record); and it fails the test if tollgate_batches has the batch (only
// an earlier version's batch is kept there) or tollgate_claims a record
// for the call (only a version 1 batch's calls have one).
func (c *cluster) claim(t *testing.T, turn string, i int) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	logs, p := c.turnLog(ctx, t, turn)
	last, err := logs[p].GetLastMsgForSubject(ctx, topology.TurnLogWildcard(p, turn))
	if err != nil {
		t.Fatalf("batch %s in %s: %v", turn, topology.TurnLogStream(p), err)
	}
	var m struct {
		V      int              `msgpack:"v"`
		State  string           `msgpack:"state"`
		Claims []map[string]any `msgpack:"claims"`
	}
	if err := msgpack.Unmarshal(last.Data, &m); err != nil {
		t.Fatalf("batch %s: %v", turn, err)
	}
	if m.V != 2 || i >= len(m.Claims) || m.Claims[i] == nil {
		t.Fatalf("batch %s: version %d, claims %v; want version 2 with a claim of call %d", turn, m.V, m.Claims, i)
	}
	event := m.State
	if m.State == "completed" || m.State == "failed" {
		event = topology.EventTurnOutcome // the write that ends a batch is its turn's outcome event
	}
	if want := topology.TurnLogSubject(p, turn, event); last.Subject != want {
		t.Fatalf("batch %s: its last event is on %s, want %s (the event named for the state it leaves the batch in, outcome for an end)", turn, last.Subject, want)
	}
	batches, err := c.js.KeyValue(ctx, bucketBatches)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucketBatches, err)
	}
	if _, err := batches.Get(ctx, turn); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("batch %s in %s: %v, want none (a batch created now is kept in its turn's log)", turn, bucketBatches, err)
	}
	claims, err := c.js.KeyValue(ctx, bucketClaims)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucketClaims, err)
	}
	callID := turn + "-" + strconv.Itoa(i)
	if _, err := claims.Get(ctx, callID); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("claim record of %s in %s: %v, want none (a version 2 batch's claims are in its record)", callID, bucketClaims, err)
	}
	return m.Claims[i]
}

func (c *cluster) testMalformedInbound(t *testing.T) {
	payload := []byte("this is not msgpack " + nonce(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := c.js.Publish(ctx, "tollgate.inbound.cli.s-malformed", payload)
	if err != nil {
		t.Fatalf("raw publish: %v", err)
	}

	type row struct {
		Stage           string `json:"stage"`
		Code            string `json:"code"`
		OriginalSubject string `json:"original_subject"`
		OriginalSeq     string `json:"original_seq"`
		Bytes           int    `json:"bytes"`
		DLQSeq          uint64 `json:"dlq_seq"`
	}
	var hit row
	jstest.EventuallyState(t, jstest.Wait, "the malformed message in tollgate dlq", func() (bool, string) {
		var rows []row
		c.cliJSON(t, 0, &rows, "dlq")
		for _, r := range rows {
			if r.OriginalSubject == "tollgate.inbound.cli.s-malformed" && r.OriginalSeq == strconv.FormatUint(ack.Sequence, 10) {
				hit = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d dead letters, none for inbound seq %d: %+v", len(rows), ack.Sequence, rows)
	})
	if hit.Code != "MALFORMED_PAYLOAD" || hit.Stage != "ingest" || hit.Bytes != len(payload) {
		t.Errorf("dead letter %+v, want MALFORMED_PAYLOAD from ingest with %d bytes", hit, len(payload))
	}
	// The dead letter keeps the original bytes.
	s, err := c.js.Stream(ctx, streamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, hit.DLQSeq)
	if err != nil {
		t.Fatalf("dead letter %d: %v", hit.DLQSeq, err)
	}
	if string(m.Data) != string(payload) {
		t.Errorf("dead letter holds %q, want the original %q", m.Data, payload)
	}
	v, found, body := c.metric(t, "ingest", "tollgate_messages_dead_lettered_total", `stage="ingest"`, `code="MALFORMED_PAYLOAD"`)
	if !found || v != 1 {
		t.Errorf("ingest dead-letter counter = %v (found %v), want 1\n%s", v, found, body)
	}

	// The worker kept running: a later turn still works.
	if c.stage("ingest").Exited() {
		t.Fatal("ingest exited after the malformed message")
	}
	text := "after the poison " + nonce(t)
	turn := c.send(t, "e2e-after-dlq", callArg(t, "echo", map[string]string{"text": text}))
	b := c.outcome(t, turn, 20*time.Second)
	if b.State != "completed" || len(b.Results) != 1 || b.Results[0] == nil || b.Results[0].Output != text {
		t.Fatalf("turn after the dead letter: %+v", b)
	}
}
