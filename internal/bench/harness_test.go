package bench

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The turn times the closed loops keep until the report is written hold no
// pointer, so that the garbage collector of the process they share with
// the stages and the server never scans them (turnTimes' doc).
func TestKeptTurnTimesHoldNoPointer(t *testing.T) {
	var walk func(reflect.Type) string
	walk = func(ty reflect.Type) string {
		switch ty.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			return ""
		case reflect.Array:
			return walk(ty.Elem())
		case reflect.Struct:
			for i := range ty.NumField() {
				if bad := walk(ty.Field(i).Type); bad != "" {
					return ty.Field(i).Name + ": " + bad
				}
			}
			return ""
		}
		return ty.String()
	}
	if bad := walk(reflect.TypeFor[turnTimes]()); bad != "" {
		t.Fatalf("turnTimes holds a pointer (%s)", bad)
	}
}

func TestInstantsKeepTheClocksOrderAndDistances(t *testing.T) {
	if !at(time.Time{}).IsZero() {
		t.Fatal("the zero time is not the zero instant")
	}
	t0 := time.Now()
	t1 := t0.Add(1500 * time.Microsecond)
	a, b := at(t0), at(t1)
	if a.IsZero() || b.IsZero() {
		t.Fatalf("a seen moment is the zero instant: %d, %d", a, b)
	}
	if got := b.Sub(a); got != 1500*time.Microsecond {
		t.Fatalf("b - a = %v, want 1.5ms", got)
	}
	if !a.Before(b) || b.Before(a) || a.Before(a) {
		t.Fatalf("order of %d and %d is wrong", a, b)
	}
	if n := now(); n.Before(a) {
		t.Fatalf("now (%d) is before a moment already past (%d)", n, a)
	}
}

// The tools' sandboxes are in a directory of their own below ToolDir, gone
// with the server; with ToolDirStore they are in the server's directory.
func TestToolSandboxesAreBelowToolDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		toolDir func(t *testing.T) string
	}{
		{"in a directory of their own", func(t *testing.T) string { return t.TempDir() }},
		{"beside the store", func(*testing.T) string { return ToolDirStore }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toolDir := tc.toolDir(t)
			b := &bencher{cfg: Config{WorkDir: t.TempDir(), ToolDir: toolDir}}
			e, err := b.startEnv(single)
			if err != nil {
				t.Fatal(err)
			}
			sb := e.sandbox("sandbox")
			want := e.dir
			if toolDir != ToolDirStore {
				want = toolDir
			}
			if rel, err := filepath.Rel(want, sb); err != nil || strings.HasPrefix(rel, "..") {
				t.Fatalf("sandbox %s is not below %s", sb, want)
			}
			if err := os.MkdirAll(sb, 0o750); err != nil {
				t.Fatal(err)
			}
			e.close()
			if _, err := os.Stat(sb); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("sandbox %s left after the server closed: %v", sb, err)
			}
		})
	}
}

func TestToolDirFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("BENCH_TOOL_DIR", dir)
	c, err := Defaults().FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if c.ToolDir != dir || !strings.Contains(c.Params(), "tool_dir="+dir) {
		t.Fatalf("ToolDir %q, params %q; want %s in both", c.ToolDir, c.Params(), dir)
	}
	c.WorkDir, c.ToolDir = t.TempDir(), ""
	if err := c.validate(); err == nil {
		t.Fatal("an empty ToolDir validated")
	}
}

func TestHalvesOfDecidedTurns(t *testing.T) {
	ms := func(n float64) instant { return instant(n * float64(time.Millisecond)) }
	turn := func(sent, pending, decided, done float64) turnTimes {
		return turnTimes{sent: ms(sent), pending: ms(pending), decided: ms(decided), done: ms(done)}
	}
	for _, tc := range []struct {
		name                 string
		turns                []turnTimes
		toPending, toOutcome float64
	}{
		{"no turns", nil, 0, 0},
		{"decided turns: the medians of each half", []turnTimes{turn(1, 11, 12, 32), turn(1, 31, 31, 41), turn(1, 21, 22, 52)}, 20, 20},
		{"a turn never requesting approval (the fast path)", []turnTimes{turn(1, 11, 12, 32), {sent: ms(1), done: ms(5)}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, o := halves(tc.turns)
			if p != tc.toPending || o != tc.toOutcome {
				t.Fatalf("halves = %.2f, %.2f ms; want %.2f, %.2f", p, o, tc.toPending, tc.toOutcome)
			}
			f := Figure{Samples: []sample{{Rate: 1, ToPendingMs: p, DecisionToOutcomeMs: o}}}
			if got, want := strings.Contains(f.notes(), "ms to the approval request"), p > 0; got != want {
				t.Fatalf("notes %q name the halves: %v, want %v", f.notes(), got, want)
			}
		})
	}
}
