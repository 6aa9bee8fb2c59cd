// Package docs keeps the documentation's commands true, the way Go's
// example tests keep examples true: every fenced block of README.md and
// docs/*.md whose info string carries the word "runnable" is run against a
// real `tollgate dev`, and a block that fails fails the test.
//
// The marker (README.md, "Runnable documentation"):
//
//	```sh runnable                       a shell block, run with bash -e -o pipefail;
//	                                     a line starting with "! " must fail (with the
//	                                     status "(exit N)" in its comment names, if any)
//	```python runnable                   saved as a file and run with python3
//	```js runnable                       saved as an ES module (.mjs) and run with node
//	```sh runnable policy=PATH           run against a tollgate dev started with that policy
//
// The blocks of one file with one policy run in document order, in one
// working directory, against one `tollgate dev` that the test starts from
// the freshly built binary on free loopback ports with its data in
// ./.tollgate of that directory (which also holds links to the
// repository's examples/ and docs/). In each block 127.0.0.1:4222 and
// 127.0.0.1:8080 stand for that dev's NATS and HTTP addresses; tollgate
// is on PATH, and TOLLGATE_NATS_URL, TOLLGATE_KEY (the gateway dev key)
// and, with policy=, TOLLGATE_POLICY are set. Shell variables do not carry
// from one block to the next.
package docs

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// block is one runnable block of a markdown file.
type block struct {
	file   string // relative to the repository root
	line   int    // of the opening fence
	lang   string // sh, python or js
	policy string // policy= option, relative to the repository root; "" for the built-in
	info   string // the words after the language in the opening fence
	text   string
}

func (b block) String() string { return fmt.Sprintf("%s:%d (%s)", b.file, b.line, b.lang) }

var fence = regexp.MustCompile("^(`{3,})\\s*(.*)$")

// parseBlocks returns the runnable blocks of the markdown file path (named
// rel in messages), in order. A block marked runnable in a language the
// runner does not know is an error.
func parseBlocks(rel string, data string) ([]block, error) { return parseFenced(rel, data, false) }

// parseFenced returns the fenced blocks of a markdown file: the runnable
// ones, or with all every block (lang as written).
func parseFenced(rel string, data string, all bool) ([]block, error) {
	var out []block
	var cur *block
	var open string
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		m := fence.FindStringSubmatch(strings.TrimSpace(line))
		switch {
		case open == "" && m != nil:
			open = m[1]
			fields := strings.Fields(m[2])
			runnable, policy := false, ""
			for _, f := range fields[min(1, len(fields)):] {
				switch {
				case f == "runnable":
					runnable = true
				case strings.HasPrefix(f, "policy="):
					policy = strings.TrimPrefix(f, "policy=")
				}
			}
			if all {
				cur = &block{file: rel, line: n, lang: strings.Join(fields[:min(1, len(fields))], ""), info: strings.Join(fields[min(1, len(fields)):], " ")}
				continue
			}
			if !runnable {
				cur = nil
				continue
			}
			lang := fields[0]
			switch lang {
			case "sh", "bash", "shell":
				lang = "sh"
			case "python", "py":
				lang = "python"
			case "js", "javascript", "mjs":
				lang = "js"
			default:
				return nil, fmt.Errorf("%s:%d: a runnable block in %q: the runner knows sh, python and js", rel, n, lang)
			}
			cur = &block{file: rel, line: n, lang: lang, policy: policy}
		case open != "" && m != nil && m[1] == open && m[2] == "":
			if cur != nil {
				out = append(out, *cur)
			}
			open, cur = "", nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if open != "" {
		return nil, fmt.Errorf("%s: a fenced block is not closed", rel)
	}
	return out, sc.Err()
}

// docFiles are the markdown files whose blocks are checked, relative to
// the repository root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	m, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m {
		files = append(files, filepath.Join("docs", filepath.Base(f)))
	}
	return files
}

func TestParseBlocksFindsOnlyTheMarkedBlocks(t *testing.T) {
	md := "text\n```sh\nnot marked\n```\n```sh runnable\necho one\n````\nnested\n```\n```python runnable policy=examples/policy/x.json\nprint(1)\n```\n"
	got, err := parseBlocks("x.md", md)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].text != "echo one\n````\nnested\n" || got[0].line != 5 || got[1].lang != "python" || got[1].policy != "examples/policy/x.json" {
		t.Fatalf("blocks %+v", got)
	}
	if _, err := parseBlocks("x.md", "```ruby runnable\nputs 1\n```\n"); err == nil {
		t.Fatal("a runnable block in a language the runner does not know was accepted")
	}
}

// A "! " line must fail, with the status its comment names.
func TestALineMarkedToFailMustFail(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash is needed to run the documentation's shell blocks")
	}
	for _, tc := range []struct {
		text string
		ok   bool
	}{
		{"! false   # fails\necho after\n", true},
		{"! true    # fails\n", false},
		{"! (exit 3)  # not done (exit 3)\n", true},
		{"! (exit 1)  # not done (exit 3)\n", false},
		{"false\necho unreachable\n", false},
	} {
		err := exec.Command("bash", "-e", "-o", "pipefail", "-c", mustFail(tc.text)).Run()
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok=%v", tc.text, err, tc.ok)
		}
	}
}

// TestRunnableDocs runs every runnable block of README.md and docs/*.md.
func TestRunnableDocs(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	type group struct {
		file, policy string
		blocks       []block
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, rel := range docFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := parseBlocks(rel, string(data))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			k := b.file + "\x00" + b.policy
			if byKey[k] == nil {
				byKey[k] = &group{file: b.file, policy: b.policy}
				groups = append(groups, byKey[k])
			}
			byKey[k].blocks = append(byKey[k].blocks, b)
		}
	}
	if len(groups) == 0 {
		t.Fatal("no runnable block in README.md or docs/*.md")
	}
	// make build's tollgate (TOLLGATE_TEST_BIN), else built here.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := childproc.Binaries(ctx, t.TempDir(), false, []string{"tollgate"}, "./cmd/tollgate")
	if err != nil {
		t.Fatalf("build tollgate: %v", err)
	}
	for _, g := range groups {
		name := g.file
		if g.policy != "" {
			name += " policy=" + g.policy
		}
		t.Run(name, func(t *testing.T) {
			d := startDev(t, root, bin, g.policy)
			for _, b := range g.blocks {
				d.run(t, b)
			}
		})
	}
}

// dev is one `tollgate dev` the blocks of a group run against.
type dev struct {
	root, bin, dir string
	nats, http     string // host:port
	env            []string
	proc           *childproc.Proc
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startDev starts `tollgate dev` in a new working directory, with policy
// (relative to root) when not "", and waits until it runs.
func startDev(t *testing.T, root, bin, policy string) *dev {
	t.Helper()
	d := &dev{root: root, bin: bin, dir: t.TempDir(), nats: freeAddr(t), http: freeAddr(t)}
	for _, sub := range []string{"examples", "docs"} {
		if err := os.Symlink(filepath.Join(root, sub), filepath.Join(d.dir, sub)); err != nil {
			t.Fatal(err)
		}
	}
	d.env = append(childproc.Env(),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"TOLLGATE_NATS_URL=nats://"+d.nats)
	if policy != "" {
		d.env = append(d.env, "TOLLGATE_POLICY="+filepath.Join(root, policy))
	}
	p, err := childproc.Start(filepath.Join(bin, "tollgate"), d.dir, filepath.Join(t.TempDir(), "dev.log"), d.env,
		"dev", "--data", filepath.Join(d.dir, ".tollgate"), "--listen", d.nats, "--http", d.http, "--metrics", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	d.proc = p
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("tollgate dev log:\n%s", p.LogText())
		}
	})
	jstest.Eventually(t, jstest.LongWait, "tollgate dev runs", func() bool {
		return strings.Contains(p.LogText(), "tollgate dev running") || p.Exited()
	})
	if p.Exited() {
		t.Fatalf("tollgate dev exited: %v\n%s", p.Err(), p.LogText())
	}
	key, err := os.ReadFile(filepath.Join(d.dir, ".tollgate", "gateway-dev-key"))
	if err != nil {
		t.Fatal(err)
	}
	d.env = append(d.env, "TOLLGATE_KEY="+strings.TrimSpace(string(key)))
	return d
}

// run runs block b in d's working directory and fails t when it fails.
func (d *dev) run(t *testing.T, b block) {
	t.Helper()
	text := strings.NewReplacer("127.0.0.1:4222", d.nats, "127.0.0.1:8080", d.http).Replace(b.text)
	if b.lang == "sh" {
		text = mustFail(text)
	}
	var file string
	var argv []string
	switch b.lang {
	case "sh":
		file = filepath.Join(t.TempDir(), "block.sh")
		argv = []string{"bash", "-e", "-o", "pipefail", file}
	case "python":
		file = filepath.Join(t.TempDir(), "block.py")
		argv = []string{"python3", file}
	case "js":
		file = filepath.Join(t.TempDir(), "block.mjs")
		argv = []string{"node", file}
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: %s is not installed (CI=true: .ci/run installs it)", b, argv[0])
		}
		t.Logf("%s: skipped: %s is not installed", b, argv[0])
		return
	}
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = d.dir, d.env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed after %v: %v\n--- block:\n%s--- output:\n%s", b, time.Since(start).Round(time.Millisecond), err, text, out)
	}
	t.Logf("%s: ok in %v", b, time.Since(start).Round(time.Millisecond))
}

var (
	failLine   = regexp.MustCompile(`^!\s+(.*)$`)
	exitStatus = regexp.MustCompile(`#.*\(exit (\d+)\)`)
)

// mustFail rewrites each line of a shell block that starts with "! " so
// that the block fails when the command succeeds, or when it ends with
// another status than the "(exit N)" its comment names. (Bash's own "!"
// would not do: set -e ignores a negated command.)
func mustFail(text string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		m := failLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		want := ""
		if e := exitStatus.FindStringSubmatch(m[1]); e != nil {
			want = e[1]
		}
		lines[i] = fmt.Sprintf("set +e\n%s\n__rc=$?\nset -e\n"+
			"if [ $__rc -eq 0 ]; then echo 'line %d succeeded; the doc says it fails' >&2; exit 1; fi\n"+
			"if [ -n '%s' ] && [ $__rc -ne '%s' ]; then echo \"line %d: exit $__rc; the doc says %s\" >&2; exit 1; fi",
			m[1], i+1, want, want, i+1, want)
	}
	return strings.Join(lines, "\n")
}

// The Node tool service example runs on the Node.js the README names: no
// locked dependency asks for a later one.
func TestTheNodeExampleRunsOnTheNodeTheREADMENames(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`Node\.js (\d+)\+`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md names no Node.js version (Node.js N+)")
	}
	want, _ := strconv.Atoi(string(m[1]))
	lock, err := os.ReadFile("../examples/toolservice-node/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	floor := regexp.MustCompile(`"node":\s*">=\s*(\d+)`)
	for _, e := range floor.FindAllSubmatch(lock, -1) {
		if v, _ := strconv.Atoi(string(e[1])); v > want {
			t.Errorf("examples/toolservice-node/package-lock.json: a package needs Node.js >= %d, the README says %d+", v, want)
		}
	}
}

// Every documented command block that starts the stage binaries gives
// them a seal key (they exit "seal: no keys configured" without one).
func TestDocumentedStagesGetASealKey(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	stage := regexp.MustCompile(`(?m)^\s*bin/(tollgate )?(ingest|executor|approver|redriver)\b`)
	files := append(docFiles(t, root), filepath.Join("deploy", "README.md"))
	n := 0
	for _, rel := range files {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := parseFenced(rel, string(data), true)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if !stage.MatchString(b.text) {
				continue
			}
			n++
			if !strings.Contains(b.text, "TOLLGATE_SEAL_KEY") && !strings.Contains(b.text, "--seal-keys") {
				t.Errorf("%s: starts stages without a seal key (TOLLGATE_SEAL_KEY_FILE, TOLLGATE_SEAL_KEYS or --seal-keys):\n%s", b, b.text)
			}
		}
	}
	if n == 0 {
		t.Fatal("no documented block starts the stage binaries")
	}
}
