package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/audit"
	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestAudit drives three turns through a real pipeline: bob's, which ends
// before the others start; alice's, whose approval mallory is refused and
// alice grants; and carol's, which runs while alice's waits. audit must
// tell each one's story from the streams, and only what its filters ask.
func TestAudit(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()

	early := h.Send(h.Inbound("s-audit-bob", "bob", pt.Call("echo", `{"text":"early"}`)))
	h.WaitTerminal(early)
	cut := h.OutcomeEvent(early).Time

	turn := h.Send(h.Inbound("s-audit-alice", "alice", pt.Call("echo", `{"text":"hi"}`), pt.Call("write_file", `{"path":"audit.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 1)
	a := h.WaitPending(id)
	h.WaitState(turn, schemas.BatchAwaiting)
	other := h.Send(h.Inbound("s-audit-carol", "carol", pt.Call("echo", `{"text":"meanwhile"}`)))
	h.WaitTerminal(other)
	if rej := h.WaitRejection(h.Decide(id, schemas.OptionApprove, "mallory")); rej.Code != schemas.CodeDeciderNotAuthorized {
		t.Fatalf("mallory's decision was rejected %s, want %s", rej.Code, schemas.CodeDeciderNotAuthorized)
	}
	h.Decide(id, schemas.OptionApprove, "alice")
	h.WaitTerminal(turn)

	// Alice's turn, in the order it happened: kind|approval|call|principal|status|code|decided by.
	// The batch's moves are its turn log's: awaiting and started are
	// published nowhere else (issue 36).
	story := []string{
		"accepted||||||",
		"batch||||running||", // created running: the session was free
		"batch||||awaiting||",
		"requested|" + id + "|" + turn + "-1||||", // kept by the move to awaiting
		"rejected|" + id + "||cli:mallory||DECIDER_NOT_AUTHORIZED|",
		"decided|" + id + "||cli:alice|approved||",
		"batch||||started||",
		"batch||||completed||",
		"result||" + turn + "-0||ok||",
		"result|" + id + "|" + turn + "-1||ok||cli:alice",
		"outcome||||completed||",
	}

	t.Run("a turn's timeline is exactly its events, in order", func(t *testing.T) {
		got := auditJSON(t, url, "--turn", turn)
		if rows := rowsOf(got); !slices.Equal(rows, story) {
			t.Fatalf("audit --turn:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(story, "\n"))
		}
		for i, e := range got {
			if e.TurnID != turn || e.Requester != "cli:alice" || i > 0 && e.Time.Before(got[i-1].Time) {
				t.Fatalf("event %d %+v: want turn %s of cli:alice, no earlier than the one before", i, e, turn)
			}
		}
		acc, req, dec := got[0], got[3], got[5]
		if acc.Transport != "cli" || acc.Channel != "dm/dm-alice" || acc.Audience != string(schemas.AudiencePersonal) || acc.Calls != 2 || acc.Stream != topology.StreamTurns {
			t.Fatalf("accepted = %+v, want cli dm/dm-alice, audience personal, 2 calls, from %s", acc, topology.StreamTurns)
		}
		if req.Tool != "write_file" || req.ArgsDigest != a.ArgsDigest || !slices.Equal(req.Options, a.Options) || req.ExpiresAt == nil || !req.ExpiresAt.Equal(a.ExpiresAt) {
			t.Fatalf("requested = %+v, want the approval's tool, digest %s, options %v, expiry %s", req, a.ArgsDigest, a.Options, a.ExpiresAt)
		}
		if dec.Option != schemas.OptionApprove || dec.Assurance != int(schemas.AssuranceVerified) {
			t.Fatalf("decided = %+v, want option approve with assurance verified", dec)
		}
		// Each move is the first write of its state in the turn's log: its
		// stream, sequence and subject (a started batch's claim and result
		// writes are no moves of their own).
		p := topology.TurnLogPartition(turn, len(h.Env.Buckets.TurnLogs))
		first := map[string]uint64{}
		for _, m := range h.Messages(topology.TurnLogStream(p), topology.TurnLogWildcard(p, turn)) {
			state := strings.TrimPrefix(m.Subject, topology.TurnLogSubject(p, turn, ""))
			if state == store.EventOutcome { // the end, named for the outcome: its state is the record's
				b, err := schemas.DecodeBatch(m.Data)
				if err != nil {
					t.Fatal(err)
				}
				state = string(b.State)
			}
			if first[state] == 0 {
				first[state] = m.Seq
			}
		}
		for _, e := range got {
			if e.Kind == audit.Batch && (e.Stream != topology.TurnLogStream(p) || e.Seq != first[e.Status] || e.SessionID != "s-audit-alice") {
				t.Fatalf("batch %s = %+v, want %s's seq %d, of session s-audit-alice", e.Status, e, topology.TurnLogStream(p), first[e.Status])
			}
			if e.Kind == audit.Batch && e.Status == string(schemas.BatchAwaiting) && e.Pending != 1 {
				t.Fatalf("batch awaiting = %+v, want 1 approval", e)
			}
			// The outcome and its results are read from the write that
			// ended the batch, the log's outcome event (its published
			// copy is not told again).
			// The request too: the move to awaiting keeps it (its
			// published copy is not told again).
			if e.Kind == audit.Requested && (e.Stream != topology.TurnLogStream(p) || e.Seq != first[string(schemas.BatchAwaiting)]) {
				t.Fatalf("requested = %+v, want it from %s seq %d, the awaiting event", e, topology.TurnLogStream(p), first[string(schemas.BatchAwaiting)])
			}
			if (e.Kind == audit.Outcome || e.Kind == audit.Result) && (e.Stream != topology.TurnLogStream(p) || e.Seq != first[string(schemas.BatchCompleted)]) {
				t.Fatalf("%s = %+v, want it from %s seq %d, the outcome event", e.Kind, e, topology.TurnLogStream(p), first[string(schemas.BatchCompleted)])
			}
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"a refused decider's principal finds the rejection alone", []string{"--principal", "cli:mallory"}, story[4:5]},
		{"a requester's principal finds her turn and nobody else's", []string{"--principal", "cli:alice"}, story},
		{"an approval's events are its request, decisions, rejections and its call's result", []string{"--approval", id},
			[]string{story[3], story[4], story[5], story[9]}},
		{"a turn nobody sent has no events", []string{"--turn", "t-00000000000000000000"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rows := rowsOf(auditJSON(t, append([]string{url}, tc.args...)...)); !slices.Equal(rows, tc.want) {
				t.Fatalf("audit %v:\n%s\nwant:\n%s", tc.args, strings.Join(rows, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}

	t.Run("since and until bound the events by stream time", func(t *testing.T) {
		after := turnsOf(auditJSON(t, url, "--since", cut.Add(time.Nanosecond).Format(time.RFC3339Nano)))
		if want := []string{turn, other}; !slices.Equal(after, want) {
			t.Fatalf("--since after bob's turn: turns %v, want %v", after, want)
		}
		before := auditJSON(t, url, "--until", cut.Format(time.RFC3339Nano))
		if turns := turnsOf(before); !slices.Equal(turns, []string{early}) || last(kindsOf(rowsOf(before))) != audit.Outcome {
			t.Fatalf("--until bob's outcome: %v, want bob's turn up to its outcome", rowsOf(before))
		}
		if all := turnsOf(auditJSON(t, url)); !slices.Equal(all, []string{early, turn, other}) {
			t.Fatalf("the default (last 24h): turns %v, want all three", all)
		}
	})

	t.Run("a turn of an earlier version keeps its redrive started event", func(t *testing.T) {
		// An earlier version published the move to started as a redrive
		// outcome, and kept the batch in KV with no turn log.
		old := "t-00000000000000000001"
		if !schemas.ValidKey(old) {
			t.Fatalf("%s is not a turn id", old)
		}
		h.Publish(topology.EventSubject(topology.SubjectRedrive, string(schemas.RedriveStarted)+"."+old), "",
			&schemas.RedriveOutcome{TurnID: old, Kind: schemas.RedriveStarted, Trigger: schemas.ApprovalID(old, 0), At: time.Now()})
		if rows := rowsOf(auditJSON(t, url, "--turn", old)); !slices.Equal(rows, []string{"redrive||||started||"}) {
			t.Fatalf("audit --turn %s: %v, want its redrive started event", old, rows)
		}
		// Its outcome was published, its log holds none: told from the
		// published copy.
		h.Publish(topology.EventSubject(topology.SubjectTurnOutcome, old), "",
			&schemas.TurnOutcome{TurnID: old, SessionID: "s-old", State: schemas.TurnCompleted, Results: []schemas.ToolResult{}, FinishedAt: time.Now().UTC()})
		got := auditJSON(t, url, "--turn", old)
		if rows := rowsOf(got); !slices.Equal(rows, []string{"redrive||||started||", "outcome||||completed||"}) || got[1].Stream != topology.StreamEvents {
			t.Fatalf("audit --turn %s: %v (outcome from %s), want its published outcome after its redrive", old, rows, got[len(got)-1].Stream)
		}
	})

	t.Run("a decision is told from the approvals bucket, whatever was published", func(t *testing.T) {
		// The decision is its record's revision in the bucket: with no
		// approval.decided event stored, the timeline is the same, and the
		// decided event comes from the bucket's stream.
		ctx, cancel := h.Ctx()
		defer cancel()
		events, err := h.JS.Stream(ctx, topology.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.Purge(ctx, jetstream.WithPurgeSubject(topology.EventSubject(topology.SubjectApprovalDecided, turn))); err != nil {
			t.Fatal(err)
		}
		got := auditJSON(t, url, "--turn", turn)
		if rows := rowsOf(got); !slices.Equal(rows, story) {
			t.Fatalf("audit --turn without a published decision:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(story, "\n"))
		}
		if dec := got[5]; dec.Stream != topology.StreamApprovals || dec.DecisionID == "" {
			t.Fatalf("decided = %+v, want the bucket's revision", dec)
		}
		one := auditJSON(t, url, "--approval", id)
		n := 0
		for _, e := range one {
			if e.Kind == audit.Decided {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("audit --approval %s tells %d decisions, want 1: %+v", id, n, one)
		}
	})

	t.Run("the table shows the same timeline, one line per event", func(t *testing.T) {
		var out bytes.Buffer
		if code := runAudit(auditCmd, []string{url, "--turn", turn}, &out); code != 0 {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var kinds []string
		for _, l := range lines[1:] {
			kinds = append(kinds, strings.Fields(l)[1])
		}
		if want := kindsOf(story); !strings.HasPrefix(lines[0], "TIME") || !slices.Equal(kinds, want) {
			t.Fatalf("table events %v, want %v:\n%s", kinds, want, out.String())
		}
		for _, say := range []string{"cli:mallory", "refused DECIDER_NOT_AUTHORIZED", "approved (approve, assurance 1)", "write_file ok, approval approved", a.ArgsDigest,
			"awaiting, 1 approvals", "completed, 2 results"} {
			if !strings.Contains(out.String(), say) {
				t.Fatalf("table does not say %q:\n%s", say, out.String())
			}
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"a turn id that is not a key is a usage error", []string{"--turn", "t 1"}, 2},
		{"an approval id that names no turn is a usage error", []string{"--approval", turn}, 2},
		{"an approval of another turn than --turn is a usage error", []string{"--turn", early, "--approval", id}, 2},
		{"a time that is neither RFC 3339 nor a duration is refused", []string{"--since", "yesterday"}, 1},
		{"an until before since is refused", []string{"--since", "1h", "--until", "2h"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := runAudit(auditCmd, append([]string{url}, tc.args...), &bytes.Buffer{}); code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
		})
	}
}

// auditJSON runs audit --json with args and decodes its output, which must
// be JSON Lines: one event object per line.
func auditJSON(t *testing.T, args ...string) []audit.Event {
	t.Helper()
	var out bytes.Buffer
	if code := runAudit(auditCmd, append(args, "--json"), &out); code != 0 {
		t.Fatalf("audit %v: exit %d:\n%s", args, code, out.String())
	}
	var events []audit.Event
	for line := range strings.Lines(out.String()) {
		var e audit.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Kind == "" {
			t.Fatalf("audit %v: line %q is not one event object: %v", args, line, err)
		}
		events = append(events, e)
	}
	return events
}

// rowsOf is each event as kind|approval|call|principal|status|code|decided by.
func rowsOf(events []audit.Event) []string {
	var rows []string
	for _, e := range events {
		rows = append(rows, fmt.Sprintf("%s|%s|%s|%s|%s|%s|%s", e.Kind, e.ApprovalID, e.CallID, e.Principal, e.Status, e.Code, strings.Join(e.DecidedBy, ",")))
	}
	return rows
}

func kindsOf(rows []string) []string {
	var kinds []string
	for _, r := range rows {
		kinds = append(kinds, strings.SplitN(r, "|", 2)[0])
	}
	return kinds
}

// turnsOf is the turns events belong to, in the order they first appear.
func turnsOf(events []audit.Event) []string {
	var turns []string
	for _, e := range events {
		if !slices.Contains(turns, e.TurnID) {
			turns = append(turns, e.TurnID)
		}
	}
	return turns
}
