package tools_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
