package web_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/tools"
)

// previewPolicy: web:alice decides write_file and hang calls.
const previewPolicy = `{
  "version": "web-preview-1",
  "default_approval": "required",
  "tools": {
    "write_file": {"approval": "required", "deciders": {"principals": ["web:alice"]}},
    "hang":       {"approval": "required", "deciders": {"principals": ["web:alice"]}}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// hang is a tool whose preview never answers (until the test ends).
type hang struct {
	pipelinetest.Counter
	block chan struct{}
}

func (h *hang) Preview(context.Context, tools.Call) (tools.Preview, error) {
	<-h.block
	return tools.Preview{Kind: tools.PreviewText, Text: "too late"}, nil
}

// startPreviewInbox is the inbox on a pipeline with the hang tool and a
// short preview deadline.
func startPreviewInbox(t *testing.T) *inbox {
	t.Helper()
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: previewPolicy,
		Tools:           []tools.Tool{&hang{Counter: pipelinetest.Counter{ToolName: "hang"}, block: block}},
		PreviewDeadline: 300 * time.Millisecond})
	c := &clock{}
	srv := startGateway(t, h, c, nil)
	return &inbox{H: h, t: t, url: srv.URL, srv: srv, clock: c}
}

// TestPreviewInARealBrowser: next to the arguments, the card shows what
// the call will change, as of when it was asked: write_file's diff of a
// file that exists (removed and added lines marked by sign and by del/ins,
// a file's hostile content escaped, never markup), "new file" with the
// content for one that does not, and "timed out" for a tool whose preview
// does not answer; the card is still decided. The page fits a phone's
// width with a long unbroken diff line.
func TestPreviewInARealBrowser(t *testing.T) {
	exe := chromiumPath(t)
	in := startPreviewInbox(t)
	old := "title: notes\n<img src=x onerror=alert(1)>\nowner: carol\n" + longURL + "\n"
	if err := os.WriteFile(filepath.Join(in.Sandbox, "notes.txt"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")

	diff := in.request("carol", "write_file", `{"path":"notes.txt","content":"title: notes\n<img src=x onerror=alert(1)>\nowner: dave\n`+longURL+`/more\n"}`, false)
	ds := cardSel(diff.ApprovalID)
	do(t, alice, "the diff appears next to the arguments", opened(diff.ApprovalID), chromedp.WaitVisible(chromedp.CSS(ds+` section.preview pre.diff`)))
	if got := text(t, alice, ds+" section.preview .preview-summary"); !strings.Contains(got, "+2 -2 lines") {
		t.Fatalf("summary %q, want +2 -2 lines", got)
	}
	if got := text(t, alice, ds+" section.preview del.diff-del"); got != "-owner: carol" {
		t.Fatalf("first removed line %q", got)
	}
	if got := text(t, alice, ds+" section.preview ins.diff-add"); got != "+owner: dave" {
		t.Fatalf("first added line %q", got)
	}
	if got := text(t, alice, ds+" section.preview h3"); !strings.Contains(got, "as of") {
		t.Fatalf("preview heading %q, want it to say as of when", got)
	}
	do(t, alice, "the file's markup is shown as text, never parsed",
		until(`document.querySelectorAll("section.preview img").length === 0 &&
			document.querySelector(`+jsString(ds+" section.preview pre.diff")+`).textContent.includes("<img src=x onerror=alert(1)>")`))

	fresh := in.request("carol", "write_file", `{"path":"fresh.txt","content":"hello\nworld\n"}`, false)
	fs := cardSel(fresh.ApprovalID)
	do(t, alice, "a new file says so", opened(fresh.ApprovalID), chromedp.WaitVisible(chromedp.CSS(fs+` section.preview pre.new-file`)))
	if got := text(t, alice, fs+" section.preview .preview-summary"); !strings.Contains(got, "New file") || !strings.Contains(got, "2 lines") {
		t.Fatalf("new file summary %q", got)
	}
	if got := text(t, alice, fs+" section.preview pre.new-file"); got != "hello\nworld\n" {
		t.Fatalf("new file content %q", got)
	}

	slow := in.request("carol", "hang", `{"n":1}`, false)
	ss := cardSel(slow.ApprovalID)
	do(t, alice, "a preview that timed out says so", opened(slow.ApprovalID), chromedp.WaitVisible(chromedp.CSS(ss+` section.preview .preview-missing`)))
	if got := text(t, alice, ss+" section.preview .preview-missing"); !strings.Contains(got, "Preview timed out") {
		t.Fatalf("timed-out preview says %q", got)
	}
	screenshot(t, alice, "preview.png")

	do(t, alice, "the card with a timed-out preview is still decided",
		chromedp.Click(chromedp.CSS(ss+` button[value=approve]`)),
		chromedp.WaitVisible(chromedp.CSS(ss+` .verdict-applied`)))

	do(t, alice, "the diff fits a phone's width",
		chromedp.EmulateViewport(390, 844),
		chromedp.Reload(),
		opened(diff.ApprovalID),
		chromedp.WaitVisible(chromedp.CSS(ds+` section.preview pre.diff`)),
		until(`document.documentElement.scrollWidth <= window.innerWidth &&
			[...document.querySelectorAll("section.preview pre")].every(p => p.scrollWidth <= p.clientWidth)`))
	if src := axeSourceIfPresent(t); src != "" {
		axeCheck(t, alice, src, "inbox with previews")
	}
}

// axeSourceIfPresent is axe-core's source (axeSource: failing under CI=true
// when it is missing), or "" where it is not installed outside CI.
func axeSourceIfPresent(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join("testdata", "npm", "node_modules", "axe-core", "axe.min.js")); err != nil && os.Getenv("CI") != "true" {
		return ""
	}
	return axeSource(t)
}
