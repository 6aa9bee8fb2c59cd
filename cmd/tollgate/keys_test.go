package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/seal"
)

// runKeys runs `tollgate keys args...` and returns its exit code and what
// it wrote to stdout and stderr (see runCLI).
func runKeys(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLI(t, append([]string{"keys"}, args...)...)
}

func readKeyFile(t *testing.T, path string) *seal.File {
	t.Helper()
	f, err := seal.ReadFile(path)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	return f
}

func wantPerm0600(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o600 {
		t.Fatalf("%s has mode %v, want -rw-------", path, got)
	}
}

// wantNoKeyMaterial fails if out contains any key of f, in base64 or in a
// recognizable fragment of it.
func wantNoKeyMaterial(t *testing.T, out string, f *seal.File) {
	t.Helper()
	for id, k := range f.Keys {
		if strings.Contains(out, k) || strings.Contains(out, k[:12]) {
			t.Fatalf("output prints key %s's material:\n%s", id, out)
		}
	}
}

// wantSucceeded runs cmdKeys with args, checks that it exits 0, leaves the
// key file at path with mode 0600 and prints none of its keys, and returns
// the file as written.
func wantSucceeded(t *testing.T, path string, args ...string) *seal.File {
	t.Helper()
	code, out, errOut := runKeys(t, args...)
	if code != 0 {
		t.Fatalf("keys %v: exit %d, stderr %q", args, code, errOut)
	}
	wantPerm0600(t, path)
	f := readKeyFile(t, path)
	wantNoKeyMaterial(t, out+errOut, f)
	return f
}

// wantRefused runs cmdKeys with args and checks that it exits with code,
// says wantStderr (when not empty) on stderr, prints nothing on stdout and
// leaves the file at path as it was.
func wantRefused(t *testing.T, path string, code int, wantStderr string, args ...string) {
	t.Helper()
	before, _ := os.ReadFile(path)
	got, out, errOut := runKeys(t, args...)
	if got != code {
		t.Fatalf("keys %v: exit %d, want %d (stderr %q)", args, got, code, errOut)
	}
	if !strings.Contains(errOut, wantStderr) {
		t.Errorf("keys %v: stderr %q does not say %q", args, errOut, wantStderr)
	}
	if out != "" {
		t.Errorf("keys %v: a refused command printed %q on stdout", args, out)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatalf("keys %v: a refused command changed %s", args, path)
	}
}

func TestKeysLifecycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal-keys.json")

	f := wantSucceeded(t, path, "new", "--file", path)
	if f.Current != "k1" || len(f.Keys) != 1 {
		t.Fatalf("after new: current %q keys %d, want k1 and one key", f.Current, len(f.Keys))
	}
	k1 := f.Keys["k1"]
	r1, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("new refuses to overwrite an existing file", func(t *testing.T) {
		wantRefused(t, path, 1, "exists", "new", "--file", path, "--id", "other")
	})

	t.Run("rotate makes the new id current and keeps the old key", func(t *testing.T) {
		f := wantSucceeded(t, path, "rotate", "--file", path, "--id", "k2")
		if f.Current != "k2" {
			t.Fatalf("current %q, want k2", f.Current)
		}
		if f.Keys["k1"] != k1 {
			t.Fatal("rotate changed or dropped k1")
		}
		if _, ok := f.Keys["k2"]; !ok || len(f.Keys) != 2 {
			t.Fatalf("keys %v, want k1 and k2", slices.Sorted(maps.Keys(f.Keys)))
		}
		r2, err := seal.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		// A ring from before the rotation shares k1 with the new one.
		if !slices.Contains(r2.IDs(), "k1") || slices.Contains(r1.IDs(), "k2") {
			t.Fatalf("ids before %v after %v", r1.IDs(), r2.IDs())
		}
	})

	t.Run("rotate to an existing id fails and changes nothing", func(t *testing.T) {
		wantRefused(t, path, 1, "already exists", "rotate", "--file", path, "--id", "k1")
	})

	t.Run("retire of the current key fails with exit 1", func(t *testing.T) {
		wantRefused(t, path, 1, "current", "retire", "--file", path, "--id", "k2")
	})

	t.Run("list names the keys and never prints them", func(t *testing.T) {
		code, out, errOut := runKeys(t, "list", "--file", path)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		if !strings.Contains(out, "current k2") || !strings.Contains(out, "k1") {
			t.Errorf("list printed %q, want the current id k2 and the ids k1 k2", out)
		}
		wantNoKeyMaterial(t, out+errOut, readKeyFile(t, path))
	})

	t.Run("list --json names the keys as one JSON object", func(t *testing.T) {
		code, out, errOut := runKeys(t, "list", "--file", path, "--json")
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		var got struct {
			File    string   `json:"file"`
			Current string   `json:"current"`
			Keys    []string `json:"keys"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("list --json printed %q: %v", out, err)
		}
		if got.File != path || got.Current != "k2" || !slices.Equal(got.Keys, []string{"k1", "k2"}) {
			t.Fatalf("list --json = %+v, want file %s, current k2, keys k1 k2", got, path)
		}
		wantNoKeyMaterial(t, out+errOut, readKeyFile(t, path))
	})

	t.Run("retire of an old key removes it", func(t *testing.T) {
		f := wantSucceeded(t, path, "retire", "--file", path, "--id", "k1")
		if f.Current != "k2" || len(f.Keys) != 1 {
			t.Fatalf("current %q, %d keys, want k2 alone", f.Current, len(f.Keys))
		}
	})

	t.Run("retire of an absent key fails", func(t *testing.T) {
		wantRefused(t, path, 1, "no key k1", "retire", "--file", path, "--id", "k1")
	})

	// The directory holds only the key file: no temporary files were left.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("the key file's directory holds %d entries, want 1", len(entries))
	}
}

func TestKeysNewWithAnID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	if f := wantSucceeded(t, path, "new", "--file", path, "--id", "prod-2026"); f.Current != "prod-2026" {
		t.Fatalf("current %q, want prod-2026", f.Current)
	}
}

func TestKeysUsageErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := seal.NewFile("k1").Write(good); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.json")
	if err := seal.NewFile("k1").Write(open); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"no subcommand", nil, 2},
		{"an unknown subcommand", []string{"show", "--file", good}, 2},
		{"no file", []string{"list"}, 2},
		{"an unknown flag", []string{"list", "--file", good, "--verbose"}, 2},
		{"rotate without an id", []string{"rotate", "--file", good}, 1},
		{"retire without an id", []string{"retire", "--file", good}, 1},
		{"rotate to an invalid id", []string{"rotate", "--file", good, "--id", "Bad Id"}, 1},
		{"new with an invalid id", []string{"new", "--file", filepath.Join(dir, "bad-id.json"), "--id", "Bad Id"}, 1},
		{"new under a path that is a file", []string{"new", "--file", filepath.Join(good, "such", "keys.json")}, 1},
		{"list of a missing file", []string{"list", "--file", filepath.Join(dir, "missing.json")}, 1},
		{"list of a world-readable file", []string{"list", "--file", open}, 1},
		{"rotate of a world-readable file", []string{"rotate", "--file", open, "--id", "k2"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantRefused(t, good, tt.want, "", tt.args...)
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "bad-id.json")); err == nil {
		t.Error("new with an invalid id left a file behind")
	}
	// The world-readable file was left as it was, not "fixed" or rotated.
	f, err := os.ReadFile(open)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(f, []byte(`"k2"`)) {
		t.Error("rotate wrote to a world-readable key file")
	}
}

// keys new makes the key file's directory when it is missing (mode 0700),
// as the README's `keys new --file /etc/tollgate/seal-keys.json` needs;
// when it cannot, the error names the file asked for, not a temp file.
func TestKeysNewMakesTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "tollgate")
	file := filepath.Join(dir, "seal-keys.json")
	code, out, errOut := runKeys(t, "new", "--file", file)
	if code != 0 || !strings.Contains(out, "created "+file) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	wantPerm0600(t, file)
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("directory %s: %v, %v; want mode 0700", dir, st.Mode().Perm(), err)
	}
	readKeyFile(t, file)

	// A path under a regular file cannot be made.
	blocked := filepath.Join(file, "sub", "seal-keys.json")
	code, _, errOut = runKeys(t, "new", "--file", blocked)
	if code != 1 || !strings.Contains(errOut, blocked) || strings.Contains(errOut, ".seal-keys-") {
		t.Fatalf("exit %d, stderr %q: want exit 1 naming %s and no temp file", code, errOut, blocked)
	}
}
