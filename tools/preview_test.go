package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

func TestLineDiff(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{
		{"equal", "a\nb\n", "a\nb\n", ""},
		{"a line changed in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n",
			"@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{"a line added at the end", "a\nb\n", "a\nb\nc\n", "@@ -1,2 +1,3 @@\n a\n b\n+c\n"},
		{"a line removed at the start", "a\nb\n", "b\n", "@@ -1,2 +1,1 @@\n-a\n b\n"},
		{"from nothing", "", "x\ny\n", "@@ -0,0 +1,2 @@\n+x\n+y\n"},
		{"to nothing", "x\n", "", "@@ -1,1 +0,0 @@\n-x\n"},
		{"two changes far apart are two hunks",
			"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\n",
			"@@ -1,4 +1,4 @@\n-1\n+one\n 2\n 3\n 4\n@@ -9,4 +9,4 @@\n 9\n 10\n 11\n-12\n+twelve\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tools.LineDiff(tc.old, tc.new)
			if !ok || got != tc.want {
				t.Fatalf("LineDiff = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
	if _, ok := tools.LineDiff(strings.Repeat("x\n", 2001), "x\n"); ok {
		t.Fatal("a 2,001-line side was diffed")
	}
}

func TestWriteFilePreviewChangesNothing(t *testing.T) {
	w, dir, outside := sandbox(t)
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("milk\neggs\nbread\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	call := func(args string) tools.Call { return tools.Call{CallID: "c-1", Args: args} }
	preview := func(args string) tools.PreviewResult {
		return tools.PreviewCall(context.Background(), w, call(args), time.Minute)
	}

	// A file that exists: the diff of it against what the call would write.
	got := preview(`{"path":"notes.txt","content":"milk\nbutter\nbread\n"}`)
	want := "--- notes.txt\n+++ notes.txt\n@@ -1,3 +1,3 @@\n milk\n-eggs\n+butter\n bread\n"
	if got.Status != tools.PreviewOK || got.Kind != tools.PreviewDiff || got.Text != want {
		t.Fatalf("preview of an existing file: %+v; want the diff %q", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "notes.txt")); string(b) != "milk\neggs\nbread\n" {
		t.Fatalf("the preview changed the file: %q", b)
	}

	// A file that does not exist (nor its directory): "new file", and
	// nothing is created.
	got = preview(`{"path":"new/dir/todo.txt","content":"call mum\n"}`)
	if got.Status != tools.PreviewOK || got.Kind != tools.PreviewNewFile || got.Text != "call mum\n" {
		t.Fatalf("preview of a new file: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the preview created the directory: %v", err)
	}

	if got := preview(`{"path":"notes.txt","content":"milk\neggs\nbread\n"}`); got.Status != tools.PreviewOK || got.Kind != tools.PreviewUnchanged {
		t.Fatalf("preview of a write that changes nothing: %+v", got)
	}

	// Outside the sandbox the preview fails as the call would, and reads
	// nothing there.
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cret\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"../outside/secret", "escape/secret", "/etc/hostname"} {
		got := preview(`{"path":"` + path + `","content":"x"}`)
		if got.Status != tools.PreviewFailed || strings.Contains(got.Text+got.Reason, "s3cret") {
			t.Fatalf("preview of %s: %+v; want failed, showing nothing", path, got)
		}
	}

	// Long content is cut and marked.
	got = preview(`{"path":"big.txt","content":"` + strings.Repeat("é", tools.MaxPreviewBytes) + `"}`)
	if got.Status != tools.PreviewOK || !got.Truncated || len(got.Text) > tools.MaxPreviewBytes || !strings.HasPrefix(got.Text, "éé") {
		t.Fatalf("long preview: status %s, truncated %v, %d bytes", got.Status, got.Truncated, len(got.Text))
	}
}

// stuckPreviewer never answers until released, and ignores its context.
type stuckPreviewer struct {
	release chan struct{}
	err     error
}

func (*stuckPreviewer) Name() string { return "stuck" }
func (*stuckPreviewer) Run(context.Context, tools.Call) (string, error) {
	return "", errors.New("stuck: a preview must never run the call")
}
func (s *stuckPreviewer) Preview(context.Context, tools.Call) (tools.Preview, error) {
	if s.release != nil {
		<-s.release
	}
	return tools.Preview{}, s.err
}

func TestPreviewCallNeverWaitsPastItsDeadline(t *testing.T) {
	s := &stuckPreviewer{release: make(chan struct{})}
	defer close(s.release)
	if got := tools.PreviewCall(context.Background(), s, tools.Call{}, 20*time.Millisecond); got.Status != tools.PreviewTimedOut || got.Reason == "" {
		t.Fatalf("a preview that never answers: %+v, want timed_out", got)
	}
	if got := tools.PreviewCall(context.Background(), &stuckPreviewer{err: errors.New("backend <down>")}, tools.Call{}, time.Minute); got.Status != tools.PreviewFailed || got.Reason != "backend <down>" {
		t.Fatalf("a failing preview: %+v", got)
	}
	if got := tools.PreviewCall(context.Background(), &tools.Echo{}, tools.Call{Args: `{"text":"x"}`}, time.Minute); got.Status != tools.PreviewUnsupported {
		t.Fatalf("echo: %+v, want unsupported", got)
	}
}

// A path with newlines cannot forge diff lines: the header names it
// quoted, on one line each, and the summary counts only the real change.
func TestWriteFilePreviewHeaderCannotForgeLines(t *testing.T) {
	w, dir, _ := sandbox(t)
	forged := "notes\n-salary 123456\n+++ x\n@@ -1 +1,3 @@\n+owned\n+owned"
	if err := os.WriteFile(filepath.Join(dir, forged), []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	args, _ := json.Marshal(map[string]string{"path": forged, "content": "two\n"})
	got := tools.PreviewCall(context.Background(), w, tools.Call{CallID: "c-1", Args: string(args)}, time.Minute)
	if got.Status != tools.PreviewOK || got.Kind != tools.PreviewDiff {
		t.Fatalf("preview %+v, want a diff", got)
	}
	quoted := strconv.Quote(forged)
	want := "--- " + quoted + "\n+++ " + quoted + "\n@@ -1,1 +1,1 @@\n-one\n+two\n"
	if got.Text != want {
		t.Fatalf("preview text %q, want %q", got.Text, want)
	}
	rec := got.Record(time.Now())
	if s := rec.Summary(); s != "+1 -1 lines" {
		t.Fatalf("summary %q, want +1 -1 lines", s)
	}
	for _, l := range schemas.DiffLines(got.Text) {
		if (l.Op == "add" || l.Op == "del") && strings.Contains(l.Text, "salary") {
			t.Fatalf("forged line %+v counted as a change", l)
		}
	}
	// A plain path is named as it is.
	if err := os.WriteFile(filepath.Join(dir, "plain name.txt"), []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	got = tools.PreviewCall(context.Background(), w, tools.Call{CallID: "c-2", Args: `{"path":"plain name.txt","content":"two\n"}`}, time.Minute)
	if !strings.HasPrefix(got.Text, "--- plain name.txt\n+++ plain name.txt\n") {
		t.Fatalf("preview text %q, want the plain path as it is", got.Text)
	}
}

// countingStuck is stuckPreviewer that counts how often it is asked.
type countingStuck struct {
	stuckPreviewer
	asked atomic.Int64
}

func (c *countingStuck) Preview(ctx context.Context, call tools.Call) (tools.Preview, error) {
	c.asked.Add(1)
	return c.stuckPreviewer.Preview(ctx, call)
}

// PreviewCallLimited holds a slot until the tool answers, even past the
// deadline, and a preview that finds no slot within its deadline times
// out without asking the tool.
func TestPreviewCallLimitedHoldsItsSlotUntilTheToolAnswers(t *testing.T) {
	release := make(chan struct{})
	tool := &countingStuck{stuckPreviewer: stuckPreviewer{release: release}}
	slots := make(chan struct{}, 1)
	c := tools.Call{CallID: "c-1", Args: `{}`}
	if got := tools.PreviewCallLimited(context.Background(), tool, c, 20*time.Millisecond, slots); got.Status != tools.PreviewTimedOut {
		t.Fatalf("first preview %+v, want timed_out", got)
	}
	if got := tools.PreviewCallLimited(context.Background(), tool, c, 20*time.Millisecond, slots); got.Status != tools.PreviewTimedOut {
		t.Fatalf("second preview %+v, want timed_out waiting for the slot", got)
	}
	if n := tool.asked.Load(); n != 1 {
		t.Fatalf("the tool was asked %d times while its one slot was held, want 1", n)
	}
	close(release)
	jstest.Eventually(t, 5*time.Second, "the slot is freed once the tool answers", func() bool { return len(slots) == 0 })
	if got := tools.PreviewCallLimited(context.Background(), tool, c, time.Second, slots); got.Status != tools.PreviewOK {
		t.Fatalf("preview after the slot freed %+v, want ok", got)
	}
}
