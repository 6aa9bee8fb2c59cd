package main

import (
	"encoding/json"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// outcome --json prints the batch record as stored, wherever it is kept:
// the last event of the turn's log (every batch written now), or the
// value in tollgate_batches of a batch an earlier version wrote.
func TestOutcomeJSONReadsTheBatchWhereItIsKept(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	inLog := h.Send(h.Inbound("s-json-log", "alice", pt.Call("echo", `{"text":"log"}`)))
	inBucket := h.Send(h.Inbound("s-json-bucket", "alice", pt.Call("echo", `{"text":"bucket"}`)))
	h.WaitTerminal(inLog)
	h.WaitTerminal(inBucket)
	h.MakeBucketed(inBucket)
	for _, c := range []struct{ name, turn string }{{"kept in its turn's log", inLog}, {"kept in the bucket", inBucket}} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "outcome", c.turn, url, "--json")
			var got struct {
				V       int              `json:"v"`
				TurnID  string           `json:"turn_id"`
				State   string           `json:"state"`
				Results []map[string]any `json:"results"`
			}
			if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
				t.Fatalf("exit %d, stderr %q, %v:\n%s", code, errOut, err, out)
			}
			if got.V != 2 || got.TurnID != c.turn || got.State != "completed" || len(got.Results) != 1 || got.Results[0]["status"] != "ok" {
				t.Fatalf("outcome --json = %+v, want the completed version 2 record of %s with its ok result", got, c.turn)
			}
		})
	}
}
