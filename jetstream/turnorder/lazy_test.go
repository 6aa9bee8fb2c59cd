package turnorder

import (
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// A Lazy looks its stream up on first use, tries again after a failed
// lookup, and then keeps the one Writer it made.
func TestLazyMakesOneWriterOnceItsStreamExists(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	if err := env.JS.DeleteStream(ctx, topology.StreamTurns); err != nil {
		t.Fatal(err)
	}
	l := NewLazy(env.JS)
	if w, err := l.Get(ctx); err == nil {
		t.Fatalf("Get without %s: %v, want an error", topology.StreamTurns, w)
	}
	if err := topology.Ensure(ctx, env.JS, env.Topology); err != nil {
		t.Fatal(err)
	}
	first, err := l.Get(ctx)
	if err != nil {
		t.Fatalf("Get once the stream exists: %v", err)
	}
	if again, err := l.Get(ctx); err != nil || again != first {
		t.Fatalf("second Get: %p, %v; want the first Writer %p", again, err, first)
	}
}
