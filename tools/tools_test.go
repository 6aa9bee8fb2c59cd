package tools_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

var tc = &schemas.TurnContext{TurnID: "t-1", Requester: schemas.Requester{Principal: "cli:alice"}}

func run(t testing.TB, tool tools.Tool, args string) (string, error) {
	t.Helper()
	return tool.Run(context.Background(), tools.Call{Context: tc, CallID: "t-1-0", Args: args})
}

func TestEcho(t *testing.T) {
	tests := []struct {
		name, args, want string
		wantErr          bool
	}{
		{"returns its text", `{"text":"hello, world"}`, "hello, world", false},
		{"keeps unicode and newlines", `{"text":"héllo\nwörld"}`, "héllo\nwörld", false},
		{"no text is empty", `{}`, "", false},
		{"ignores other arguments", `{"text":"x","loud":true}`, "x", false},
		{"arguments that are not an object", `[1]`, "", true},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			got, err := run(t, tools.Echo{}, c.args)
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("echo(%s) = %q, %v; want %q (error %v)", c.args, got, err, c.want, c.wantErr)
			}
		})
	}
}

// sandbox returns a write_file tool over a fresh sandbox, and a directory
// outside it that a symlink inside the sandbox points to.
func sandbox(t *testing.T) (w *tools.WriteFile, dir, outside string) {
	t.Helper()
	root := t.TempDir()
	dir, outside = filepath.Join(root, "sandbox"), filepath.Join(root, "outside")
	if err := os.MkdirAll(outside, 0o750); err != nil {
		t.Fatal(err)
	}
	ts, err := tools.Builtins(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("Builtins did not create the sandbox: %v", err)
	}
	for _, tool := range ts {
		if wf, ok := tool.(*tools.WriteFile); ok {
			w = wf
		}
	}
	if w == nil || !filepath.IsAbs(w.Dir) {
		t.Fatalf("write_file missing or its dir is not absolute: %+v", w)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "target.txt"), filepath.Join(dir, "link.txt")); err != nil {
		t.Fatal(err)
	}
	return w, dir, outside
}

func TestWriteFileWritesInsideTheSandbox(t *testing.T) {
	w, dir, _ := sandbox(t)
	tests := []struct {
		name, path, content string
	}{
		{"a file at the top", "a.txt", "one"},
		{"a file in new nested directories", "x/y/z.txt", "deep"},
		{"a path with a harmless dot segment", "./x/./dot.txt", "dot"},
		{"a path that goes down and up again", "x/../up.txt", "up"},
		{"an empty file", "empty.txt", ""},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(t, w, `{"path":"`+c.path+`","content":"`+c.content+`"}`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, filepath.Clean(c.path)))
			if err != nil || string(got) != c.content {
				t.Fatalf("file %s = %q %v, want %q", c.path, got, err, c.content)
			}
			if !strings.Contains(out, c.path) {
				t.Fatalf("output %q does not name the path", out)
			}
		})
	}
	// A second write replaces the content, it does not append.
	if _, err := run(t, w, `{"path":"a.txt","content":"2"}`); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(got) != "2" {
		t.Fatalf("overwrite gave %q", got)
	}
}

func TestWriteFileRefusesPathsOutsideTheSandbox(t *testing.T) {
	w, dir, outside := sandbox(t)
	parentFile := filepath.Join(filepath.Dir(dir), "x")
	tests := []struct {
		name, path   string
		mustNotExist string // a file that a successful escape would create
	}{
		{"a parent-relative path", "../x", parentFile},
		{"a deeper parent-relative path", "a/../../x", parentFile},
		{"an absolute path", "/etc/tollgate-test-x", "/etc/tollgate-test-x"},
		{"an absolute path into the outside dir", filepath.Join(outside, "abs.txt"), filepath.Join(outside, "abs.txt")},
		{"a path through a symlinked directory", "escape/x.txt", filepath.Join(outside, "x.txt")},
		{"a symlinked file pointing outside", "link.txt", filepath.Join(outside, "target.txt")},
		{"a nested directory through a symlink", "escape/sub/x.txt", filepath.Join(outside, "sub")},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(t, w, `{"path":"`+c.path+`","content":"pwned"}`)
			if err == nil {
				t.Fatalf("write to %q succeeded: %q", c.path, out)
			}
			if _, serr := os.Lstat(c.mustNotExist); !errors.Is(serr, os.ErrNotExist) {
				t.Fatalf("%s exists after a refused write (%v)", c.mustNotExist, serr)
			}
		})
	}
	entries, err := os.ReadDir(outside)
	if err != nil || len(entries) != 0 {
		t.Fatalf("outside dir has %v (%v), want nothing", entries, err)
	}
}

func TestWriteFileRejectsBadArguments(t *testing.T) {
	w, dir, _ := sandbox(t)
	tests := []struct{ name, args string }{
		{"no path", `{"content":"x"}`},
		{"an empty path", `{"path":"","content":"x"}`},
		{"the sandbox itself", `{"path":".","content":"x"}`},
		{"a path that is a directory", `{"path":"escape","content":"x"}`},
		{"a path that is not a string", `{"path":7}`},
		{"arguments that are not JSON", `{path:x}`},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			if out, err := run(t, w, c.args); err == nil {
				t.Fatalf("write_file(%s) succeeded: %q", c.args, out)
			}
		})
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"escape", "link.txt"}) {
		t.Fatalf("sandbox holds %v after refused writes", names)
	}
}

func BenchmarkEcho(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := run(b, tools.Echo{}, `{"text":"hello"}`); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteFile(b *testing.B) {
	w := &tools.WriteFile{Dir: b.TempDir()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := run(b, w, `{"path":"d/bench.txt","content":"hello"}`); err != nil {
			b.Fatal(err)
		}
	}
}

// The sandbox handle is kept between calls; a sandbox directory replaced
// meanwhile (deleted and made again) is opened afresh, and the write lands
// in the new one.
func TestWriteFileFollowsAReplacedSandbox(t *testing.T) {
	w, dir, _ := sandbox(t)
	if _, err := run(t, w, `{"path":"first.txt","content":"1"}`); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"second.txt", "sub/third.txt"} {
		if _, err := run(t, w, `{"path":"`+p+`","content":"2"}`); err != nil {
			t.Fatalf("write %s after the sandbox was replaced: %v", p, err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(got) != "2" {
			t.Fatalf("%s in the new sandbox = %q %v", p, got, err)
		}
	}
}
