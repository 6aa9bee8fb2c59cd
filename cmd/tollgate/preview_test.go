package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestShowGivesTheOperatorTheWholePreview (docs/security.md rule 17): the
// approval.requested event has the preview's summary only, and `tollgate
// show`, the operator's view of the stored record, shows the whole diff:
// the old lines a write would remove, with the summary.
func TestShowGivesTheOperatorTheWholePreview(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	if err := os.WriteFile(filepath.Join(h.Sandbox, "private.txt"), []byte("salary 123456\nbank PIN 4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	turn := h.Send(h.Inbound("s-private", "alice", pt.Call("write_file", `{"path":"private.txt","content":"x\n"}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	reqs := h.WaitRequested(turn, 1)
	if len(reqs) != 1 || reqs[0].Preview == nil || reqs[0].Preview.Text != "" {
		t.Fatalf("approval.requested events %+v, want the preview's summary only", reqs)
	}
	code, out, errOut := runCLI(t, "show", id, "--nats="+h.Env.URL())
	if code != 0 {
		t.Fatalf("show: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{": +1 -2 lines\n", "\n  -salary 123456\n  -bank PIN 4242\n  +x\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
}
