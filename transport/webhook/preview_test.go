package webhook_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// A webhook receiver is told what a pending write would change in summary
// only (docs/security.md rule 17): the approval.requested body's preview
// has its status, kind and counts, and never the lines of the file it
// would overwrite.
func TestWebhooksGetThePreviewSummaryOnly(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{})
	if err := os.WriteFile(filepath.Join(h.Sandbox, "private.txt"), []byte("salary 123456\nbank PIN 4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t)
	startDispatcher(t, h.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/hooks"), Secret: newSecret(t), Transports: []string{"cli"}},
	}})

	turn := h.Send(h.Inbound("webhook-preview", "alice", pipelinetest.Call("write_file", `{"path":"private.txt","content":"x\n"}`)))
	id := schemas.ApprovalID(turn, 0)
	if a := h.WaitPending(id); a.Preview == nil || !strings.Contains(a.Preview.Text, "salary 123456") {
		t.Fatalf("stored preview %+v, want the whole diff", a.Preview)
	}
	reqs := rcv.waitFor("/hooks", "requested:"+id)
	body := reqs[0].Body
	if strings.Contains(string(body), "salary") || strings.Contains(string(body), "4242") {
		t.Fatalf("approval.requested webhook holds the old lines: %s", body)
	}
	var b struct {
		Data struct {
			Preview map[string]any `json:"preview"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	p := b.Data.Preview
	if p["redacted"] != true || p["status"] != "ok" || p["kind"] != "diff" || p["added"] != 1.0 || p["removed"] != 2.0 || p["text"] != nil {
		t.Fatalf("webhook preview %v, want the summary only (+1 -2)", p)
	}
}
