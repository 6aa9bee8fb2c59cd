package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// previewing is a test tool with a preview: it answers with err, or never
// (until the test ends) when block is set, ignoring its context.
type previewing struct {
	pt.Counter
	err   error
	block chan struct{}
}

func (p *previewing) Preview(_ context.Context, c tools.Call) (tools.Preview, error) {
	if p.block != nil {
		<-p.block
	}
	if p.err != nil {
		return tools.Preview{}, p.err
	}
	return tools.Preview{Kind: tools.PreviewText, Text: "would count " + c.Args}, nil
}

const previewPolicy = `{
  "version": "preview-1",
  "default_approval": "required",
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// The pending approval record carries the tool's preview of the call as of
// its creation, and the approval-requested event its summary: write_file's diff of the
// file as it is, "new file", a tool's own text; a preview that fails or
// does not answer within the deadline is stored as such and the prompt is
// still made.
func TestPendingApprovalCarriesThePreview(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	failing := &previewing{Counter: pt.Counter{ToolName: "failing"}, err: errors.New("backend down")}
	slow := &previewing{Counter: pt.Counter{ToolName: "slow"}, block: block}
	plain := &previewing{Counter: pt.Counter{ToolName: "plain"}}
	h := pt.Start(t, pt.Options{Policy: previewPolicy, Tools: []tools.Tool{failing, slow, plain, &pt.Counter{}},
		PreviewDeadline: 300 * time.Millisecond})
	if err := os.WriteFile(filepath.Join(h.Sandbox, "notes.txt"), []byte("one\ntwo\nthree\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool, args string
		status, kind     string
		has              []string
	}{
		{"write_file on a file that exists: a diff", "write_file", `{"path":"notes.txt","content":"one\nTWO\nthree\n"}`,
			schemas.PreviewOK, tools.PreviewDiff, []string{"--- notes.txt", "-two\n", "+TWO\n", " one\n"}},
		{"write_file on a file that does not exist: new file", "write_file", `{"path":"fresh.txt","content":"hello\n"}`,
			schemas.PreviewOK, tools.PreviewNewFile, []string{"hello\n"}},
		{"a tool's own text", "plain", `{"n":1}`, schemas.PreviewOK, tools.PreviewText, []string{`would count {"n":1}`}},
		{"a failing preview", "failing", `{"n":1}`, schemas.PreviewFailed, "", []string{"backend down"}},
		{"a preview that never answers", "slow", `{"n":1}`, schemas.PreviewTimedOut, "", []string{"300ms"}},
		{"a tool with no preview", "count", `{"n":1}`, schemas.PreviewUnsupported, "", nil},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn := h.Send(h.Inbound(fmt.Sprintf("preview-%d", i), "alice", pt.Call(tc.tool, tc.args)))
			id := schemas.ApprovalID(turn, 0)
			a := h.WaitPending(id)
			p := a.Preview
			if p == nil || p.Status != tc.status || p.Kind != tc.kind {
				t.Fatalf("preview %+v, want status %s kind %q", p, tc.status, tc.kind)
			}
			if p.At.IsZero() || p.At.Before(a.RequestedAt.Add(-time.Second)) {
				t.Fatalf("preview as of %v, record requested at %v", p.At, a.RequestedAt)
			}
			got := p.Text + p.Reason
			for _, s := range tc.has {
				if !strings.Contains(got, s) {
					t.Errorf("preview %q lacks %q", got, s)
				}
			}
			// The event has the preview summary-only (docs/security.md
			// rule 17): status, kind and counts, nothing of the content
			// (marked redacted where there was content to leave out).
			reqs := h.WaitRequested(turn, 1)
			if len(reqs) != 1 || reqs[0].Preview == nil {
				t.Fatalf("approval-requested events %+v, want one with a preview", reqs)
			}
			e, want := reqs[0].Preview, p.SummaryOnly()
			if e.Redacted != want.Redacted || e.Text != "" || e.Reason != "" || e.Status != want.Status || e.Kind != want.Kind ||
				e.Added != want.Added || e.Removed != want.Removed || e.Lines != want.Lines || e.Summary() != p.Summary() {
				t.Fatalf("approval-requested preview %+v, want the record's summary only %+v", e, want)
			}
		})
	}
	if _, ok := h.File("fresh.txt"); ok {
		t.Fatal("a preview created the file")
	}
	if n := len(slow.Calls()) + len(failing.Calls()) + len(plain.Calls()); n != 0 {
		t.Fatalf("tools ran %d times before any decision", n)
	}
}

// The decision binds the arguments, never the preview: a preview edited in
// KV (to show a harmless change) neither stops the decision from applying
// nor changes what runs: the file gets the content the arguments hold.
func TestATamperedPreviewCannotChangeWhatRuns(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	turn := h.Send(h.Inbound("tamper-preview", "alice", pt.Call("write_file", `{"path":"cfg.txt","content":"mode=open\n"}`)))
	id := schemas.ApprovalID(turn, 0)
	a := h.WaitPending(id)
	if a.Preview == nil || a.Preview.Kind != tools.PreviewNewFile || a.Preview.Text != "mode=open\n" {
		t.Fatalf("preview %+v, want new file mode=open", a.Preview)
	}
	h.MutateApproval(id, func(a *schemas.ApprovalRecord) {
		a.Preview.Kind, a.Preview.Text = tools.PreviewNewFile, "mode=closed\n"
	})
	h.Decide(id, schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultOK {
		t.Fatalf("result %+v, want ok", r)
	}
	if content, _ := h.File("cfg.txt"); content != "mode=open\n" {
		t.Fatalf("file holds %q, want the arguments' content", content)
	}
	if d := h.Approval(id).Decision; d == nil || d.Option != schemas.OptionApprove {
		t.Fatalf("decision %+v", d)
	}
}
