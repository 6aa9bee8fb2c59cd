package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestInspectingATurn drives one turn with an approval through the
// pipeline and reads it back the way a decider and an operator would:
// show, outcome (while waiting, and once decided) and watch.
func TestInspectingATurn(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	content := strings.Repeat("a line a decider must read in full. ", 8)
	args := `{"path":"notes/full.txt","content":"` + content + `"}`
	turn := h.Send(h.Inbound("s-inspect", "alice", pt.Call("echo", `{"text":"hi"}`), pt.Call("write_file", args)))
	id := schemas.ApprovalID(turn, 1)
	a := h.WaitPending(id)

	t.Run("show prints the whole call and what a decider needs", func(t *testing.T) {
		code, out, errOut := runCLI(t, "show", id, url)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		for _, want := range []string{
			id + " (pending)", turn, "write_file", a.ArgsDigest, `"content": "` + content + `"`,
			"cli:alice", "user, verified", "dm dm-alice", "audience personal", strings.Join(a.Options, ", "),
			a.PolicyVersion, a.ExpiresAt.UTC().Format("2006-01-02T15:04:05Z07:00"), "(in ",
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("show does not say %q:\n%s", want, out)
			}
		}
	})

	t.Run("show --json is the whole record", func(t *testing.T) {
		code, out, _ := runCLI(t, "show", id, url, "--json")
		var got struct {
			ApprovalID string `json:"approval_id"`
			Args       string `json:"args"`
			Context    struct {
				Channel struct {
					ID string `json:"id"`
				} `json:"channel"`
			} `json:"context"`
		}
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
			t.Fatalf("exit %d, %v:\n%s", code, err, out)
		}
		if got.ApprovalID != id || got.Args != a.Args || got.Context.Channel.ID != "dm-alice" {
			t.Fatalf("show --json = %+v, want approval %s with its arguments and channel", got, id)
		}
	})

	t.Run("show of an approval that does not exist fails", func(t *testing.T) {
		if code, _, errOut := runCLI(t, "show", schemas.ApprovalID(turn, 7), url); code != 1 || !strings.Contains(errOut, "no approval") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("outcome --wait says it timed out, with its own exit status", func(t *testing.T) {
		code, out, errOut := runCLI(t, "outcome", turn, url, "--wait", "200ms")
		if code != exitTimedOut || !strings.Contains(errOut, "timed out after 200ms") || !strings.Contains(errOut, "still awaiting") {
			t.Fatalf("exit %d, stderr %q; want %d and a timeout message", code, errOut, exitTimedOut)
		}
		if !strings.Contains(out, "state awaiting") {
			t.Fatalf("outcome did not print the batch as it stands:\n%s", out)
		}
	})

	h.Decide(id, "approve", "alice")
	h.WaitTerminal(turn)

	t.Run("outcome says who approved each call", func(t *testing.T) {
		code, out, errOut := runCLI(t, "outcome", turn, url)
		if code != 0 || !strings.Contains(out, "cli:alice (approve)") {
			t.Fatalf("exit %d, stderr %q; outcome does not name the approver:\n%s", code, errOut, out)
		}
		code, out, _ = runCLI(t, "outcome", turn, url, "--json")
		var got struct {
			State     string `json:"state"`
			Decisions map[string]struct {
				Status   string `json:"status"`
				Decision struct {
					Principal string `json:"principal"`
					Option    string `json:"option"`
				} `json:"decision"`
			} `json:"decisions"`
		}
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
			t.Fatalf("exit %d, %v:\n%s", code, err, out)
		}
		if d := got.Decisions[id]; got.State != "completed" || d.Status != "approved" || d.Decision.Principal != "cli:alice" || d.Decision.Option != "approve" || len(got.Decisions) != 1 {
			t.Fatalf("outcome --json = %+v, want %s approved by cli:alice and no other decision", got, id)
		}
	})

	t.Run("watch --json prints one JSON object per line", func(t *testing.T) {
		r, w := io.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), pt.Wait) // ends a watch that never sees the outcome
		defer cancel()
		done := make(chan int, 1)
		go func() {
			done <- runWatch(ctx, watchCmd, []string{url, "--all", "--turn", turn, "--json"}, w, io.Discard)
			w.Close()
		}()
		lines := bufio.NewScanner(r)
		var subjects []string
		for !strings.HasPrefix(last(subjects), topology.SubjectTurnOutcome) && lines.Scan() {
			var ev struct {
				Subject string         `json:"subject"`
				Event   map[string]any `json:"event"`
			}
			if err := json.Unmarshal(lines.Bytes(), &ev); err != nil || ev.Subject == "" || ev.Event == nil {
				t.Fatalf("line %q is not one event object: %v", lines.Text(), err)
			}
			subjects = append(subjects, ev.Subject)
		}
		cancel()
		go func() { _, _ = io.Copy(io.Discard, r) }()
		if code := <-done; code != 0 || !strings.HasPrefix(last(subjects), topology.SubjectTurnOutcome) {
			t.Fatalf("exit %d after events %v; want the turn's outcome among them", code, subjects)
		}
	})
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// TestPendingReadsLegacyRecords writes a version 1 approval record, as an
// older executor did, and lists it: pending must read it through the one
// compatibility path, as the stages do, not skip it.
func TestPendingReadsLegacyRecords(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	turn := h.Send(h.Inbound("s-legacy", "bob", pt.Call("write_file", `{"path":"old.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	a := h.WaitPending(id)
	h.WaitIdle(pt.AllStages...)
	h.Stop()
	tc := a.Context
	v1, err := msgpack.Marshal(&schemas.ApprovalRecordV1{
		V: schemas.ApprovalLegacyVersion, ApprovalID: a.ApprovalID, TurnID: a.TurnID, SessionID: a.SessionID, CallID: a.CallID,
		Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest, PolicyVersion: a.PolicyVersion, Options: a.Options,
		Status: a.Status, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
		Transport: tc.Transport, Sender: &schemas.Sender{ID: tc.Requester.SenderID, Kind: tc.Requester.Kind, Verified: tc.Requester.Verified},
		Channel: &tc.Channel, Audience: tc.Audience, TrustBoundary: tc.TrustBoundary,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.PutRaw(h.Store.Approvals.KV, id, v1)
	url := "--nats=" + h.Env.URL()

	code, out, errOut := runCLI(t, "pending", url, "--session", "s-legacy", "--json")
	if code != 0 || strings.Contains(errOut, "skipping") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got []struct {
		ApprovalID string `json:"approval_id"`
		Context    struct {
			LegacyRestored bool `json:"legacy_restored"`
			Requester      struct {
				Principal string `json:"principal"`
			} `json:"requester"`
		} `json:"context"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(got) != 1 || got[0].ApprovalID != id || !got[0].Context.LegacyRestored || got[0].Context.Requester.Principal != "cli:bob" {
		t.Fatalf("pending --json = %+v, want %s with a restored, legacy-marked context of cli:bob", got, id)
	}
	if code, out, _ := runCLI(t, "pending", url, "--session", "s-legacy"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "cli:bob (legacy)") {
		t.Fatalf("exit %d; pending does not list the legacy approval as such:\n%s", code, out)
	}
}

func TestWatchSaysWhereAnOutcomeGoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    schemas.TurnOutcome
		want string
	}{
		{"a verified context's reply target", schemas.TurnOutcome{TurnID: "t-1", State: schemas.TurnCompleted, Audience: schemas.AudiencePersonal,
			Reply: schemas.ReplyTarget{Transport: "cli", Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}}},
			"turn t-1 completed (0 results) -> cli dm/dm-alice"},
		{"no verified context: nowhere, with the code", schemas.TurnOutcome{TurnID: "t-2", State: schemas.TurnFailed, Code: schemas.CodeTurnContextTampered},
			"turn t-2 failed (0 results) -> nowhere (TURN_CONTEXT_TAMPERED)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := schemas.Encode(&tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(topology.SubjectTurnOutcome+"x", data); got != tc.want {
				t.Fatalf("summary = %q, want %q", got, tc.want)
			}
		})
	}
}

// watch says at once that it is waiting, on stderr, before any event.
func TestWatchSaysItIsWaiting(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errR, errW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- runWatch(ctx, watchCmd, []string{"--nats=" + h.Env.URL()}, &out, errW)
		errW.Close()
	}()
	line, err := bufio.NewReader(errR).ReadString('\n')
	if err != nil || !strings.Contains(line, "waiting for new events") || !strings.Contains(line, "Ctrl-C") {
		t.Fatalf("watch said %q (%v), want that it waits for new events", line, err)
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, errR) }()
	if code := <-done; code != 0 || out.Len() != 0 {
		t.Fatalf("exit %d, stdout %q: want 0 and no event", code, out.String())
	}
}
