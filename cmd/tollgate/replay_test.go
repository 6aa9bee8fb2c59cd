package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

func TestReplayCommand(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "seal-keys.json")
	f := seal.NewFile("k1")
	if err := f.Write(keyFile); err != nil {
		t.Fatal(err)
	}
	ring, err := f.Ring()
	if err != nil {
		t.Fatal(err)
	}
	h := pt.Start(t, pt.Options{Keys: ring})
	turn := h.Send(h.Inbound("s-cli", "alice", pt.Call("write_file", `{"path":"a","content":"b"}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	h.WaitIdle(pt.AllStages...)
	h.Stop()
	// As an earlier version left it: in tollgate_batches (a batch kept in
	// its turn's log is never rebuilt), which is then lost.
	h.MakeBucketed(turn)
	h.RecordSessions(turn) // and the session record it kept
	ctx, cancel := h.Ctx()
	defer cancel()
	if err := h.JS.DeleteKeyValue(ctx, topology.BucketBatches); err != nil {
		t.Fatal(err)
	}
	url := "--nats=" + h.Env.URL()

	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string // in the output
	}{
		{"a report says what a rebuild would write", []string{url, "--json"}, 0, `"changes": 1`},
		{"a dry run judges the batch as the streams have it", []string{url, "--dry-run", "--seal-keys", keyFile, "--since", "1h"}, 0, "deferred"},
		{"rebuild and dry-run together are refused", []string{url, "--rebuild", "--dry-run"}, 1, ""},
		{"a time that is neither RFC 3339 nor a duration is refused", []string{url, "--since", "yesterday"}, 1, ""},
		{"a rebuild writes the missing batch", []string{url, "--rebuild"}, 0, "create (awaiting)"},
		{"a second rebuild changes nothing", []string{url, "--rebuild", "--json"}, 0, `"changes": 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := runReplay(replayCmd, tc.args, &out); code != tc.code {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tc.code, out.String())
			}
			if !strings.Contains(out.String(), tc.contains) {
				t.Fatalf("output does not say %q:\n%s", tc.contains, out.String())
			}
			if strings.Contains(strings.Join(tc.args, " "), "--json") {
				var rep replay.Report
				if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Turns) != 1 || rep.Turns[0].TurnID != turn {
					t.Fatalf("JSON report %+v (%v), want one turn %s", rep, err, turn)
				}
			}
		})
	}
	if b := h.Batch(turn); b == nil || b.State != schemas.BatchAwaiting {
		t.Fatalf("batch after the rebuild: %+v, want awaiting", b)
	}
}

func TestReplayCommandShowsABatchKeptInItsTurnLog(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	turn := h.Send(h.Inbound("s-cli-log", "alice", pt.Call("write_file", `{"path":"a","content":"b"}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	h.WaitIdle(pt.AllStages...)
	h.Stop()
	var out bytes.Buffer
	if code := runReplay(replayCmd, []string{"--nats=" + h.Env.URL(), "--rebuild"}, &out); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "unchanged (awaiting, turn log)") || !strings.Contains(out.String(), "0 changes") {
		t.Fatalf("output does not show the batch unchanged in its turn log:\n%s", out.String())
	}
}
