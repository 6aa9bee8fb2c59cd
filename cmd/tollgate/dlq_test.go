package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

func TestDLQNamesTheTurnOfAnInboundDeadLetter(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{pt.Ingest}})
	url := "--nats=" + h.Env.URL()
	// A message that decodes but that ingest refuses (as a transport that
	// skips `tollgate send`'s check would publish it), then bytes that name
	// nothing.
	m := h.Inbound("s-dlq", "alice", pt.Call("echo", `{"text":`))
	m.V = schemas.InboundVersion
	bad, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	subject := topology.InboundSubject("cli", "s-dlq")
	badSeq := h.PublishRaw(subject, "", bad, nil)
	junkSeq := h.PublishRaw(subject, "", []byte("not msgpack"), nil)
	h.WaitDLQ(pt.Ingest, 2)
	turn := schemas.TurnID("cli", m.MessageID)

	code, out, errOut := runCLI(t, "dlq", url, "--json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 2 {
		t.Fatalf("exit %d, %v, stderr %q:\n%s", code, err, errOut, out)
	}
	bySeq := map[string]map[string]any{} // ingest may dead-letter them in either order
	for _, r := range rows {
		bySeq[r["original_seq"].(string)] = r
	}
	r, junk := bySeq[fmt.Sprint(badSeq)], bySeq[fmt.Sprint(junkSeq)]
	if r["turn_id"] != turn || r["message_id"] != m.MessageID || r["code"] != string(schemas.CodeArgsInvalidJSON) {
		t.Fatalf("dead letter %v, want turn %s, message %s, code %s", r, turn, m.MessageID, schemas.CodeArgsInvalidJSON)
	}
	if reason := r["reason"].(string); reason == "" || strings.Contains(reason, string(schemas.CodeArgsInvalidJSON)) {
		t.Fatalf("reason %q repeats the code, or is empty", reason)
	}
	if _, ok := junk["turn_id"]; ok || junk["code"] != string(schemas.CodeMalformed) {
		t.Fatalf("undecodable dead letter %v: want no turn and code %s", junk, schemas.CodeMalformed)
	}

	code, out, _ = runCLI(t, "dlq", url)
	if code != 0 || !strings.Contains(out, turn) || !strings.Contains(out, m.MessageID) {
		t.Fatalf("exit %d; dlq does not show the turn %s and message %s:\n%s", code, turn, m.MessageID, out)
	}
}
