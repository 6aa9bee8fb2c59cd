package jstest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// fatalTB records the first Fatalf and ends the goroutine as testing does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	panic(f)
}

func run(f *fatalTB, fn func()) {
	defer func() {
		if r := recover(); r != nil && r != f {
			panic(r)
		}
	}()
	fn()
}

// A timeout names the last state the condition saw.
func TestEventuallyStateReportsTheLastState(t *testing.T) {
	f := &fatalTB{TB: t}
	n := 0
	run(f, func() {
		jstest.EventuallyState(f, 50*time.Millisecond, "outcome of t-1", func() (bool, string) {
			n++
			return false, fmt.Sprintf("state awaiting (poll %d)", n)
		})
	})
	want := fmt.Sprintf("outcome of t-1: last seen: state awaiting (poll %d)", n)
	if !strings.Contains(f.msg, want) {
		t.Fatalf("failure %q does not say %q", f.msg, want)
	}
}

// The scale stretches the deadline; a bad value is refused, naming the
// variable.
func TestScale(t *testing.T) {
	t.Setenv(jstest.ScaleEnv, "3")
	if got := jstest.Scale(2 * time.Second); got != 6*time.Second {
		t.Errorf("Scale(2s) with 3 = %v, want 6s", got)
	}
	for _, bad := range []string{"fast", "0.5", "-1"} {
		t.Setenv(jstest.ScaleEnv, bad)
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), jstest.ScaleEnv) {
					t.Errorf("Scale with %q: %v, want a panic naming %s", bad, r, jstest.ScaleEnv)
				}
			}()
			jstest.Scale(time.Second)
		}()
	}
}
