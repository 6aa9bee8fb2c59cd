package store_test

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
)

// entry is a test index's entry: a value's first word and the key.
type entry struct{ rank, key string }

func entryLess(a, b *entry) bool {
	return a.rank < b.rank || a.rank == b.rank && a.key < b.key
}

// ascend is every entry of x from {rank, ""} on, as "rank/key".
func ascend(x *store.Index[*entry], rank string) []string {
	var out []string
	x.Ascend(&entry{rank: rank}, func(e *entry) bool {
		out = append(out, e.rank+"/"+e.key)
		return true
	})
	return out
}

// TestOrderedIndexFollowsEveryChange: an index made OrderedBy keeps its
// order through the bucket's values before it starts, then puts that
// move a key, deletes, purges and values it does not keep; Ascend seeks
// to its pivot and stops when told.
func TestOrderedIndexFollowsEveryChange(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	kv := env.Buckets.Approvals
	put := func(key, value string) {
		t.Helper()
		if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	put("k1", "b")
	put("k2", "a")
	put("k3", "c")
	x, err := store.NewIndex(ctx, kv, "test", func(key string, v []byte) (*entry, bool) {
		return &entry{rank: string(v), key: key}, !strings.HasPrefix(string(v), "skip")
	}, slog.New(slog.DiscardHandler), store.OrderedBy(entryLess))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Stop() })
	sync := func() {
		t.Helper()
		if err := x.Sync(ctx, jstest.Scale(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if got, want := ascend(x, ""), []string{"a/k2", "b/k1", "c/k3"}; !slices.Equal(got, want) {
		t.Fatalf("initial order %v, want %v", got, want)
	}

	put("k2", "d")    // moves from first to last
	put("k4", "b")    // ties k1's rank: ordered by key
	put("k5", "skip") // not kept
	if err := kv.Delete(ctx, "k3"); err != nil {
		t.Fatal(err)
	}
	put("k6", "a")
	if err := kv.Purge(ctx, "k6"); err != nil {
		t.Fatal(err)
	}
	sync()
	if got, want := ascend(x, ""), []string{"b/k1", "b/k4", "d/k2"}; !slices.Equal(got, want) {
		t.Fatalf("order after changes %v, want %v", got, want)
	}
	if got, want := ascend(x, "c"), []string{"d/k2"}; !slices.Equal(got, want) {
		t.Fatalf("from pivot c: %v, want %v", got, want)
	}
	if n := x.Len(); n != 3 {
		t.Fatalf("Len %d, want 3 (the ordered entries and the map agree)", n)
	}
	put("k1", "skip") // a kept key whose new value is not kept leaves both
	sync()
	var first []string
	x.Ascend(&entry{}, func(e *entry) bool { first = append(first, e.key); return false })
	if !slices.Equal(first, []string{"k4"}) {
		t.Fatalf("Ascend that stops at once saw %v, want [k4]", first)
	}
}
