package eventfeed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

func newFeed(t *testing.T) (*jstest.Env, *Feed) {
	env := jstest.Start(t)
	f := New(env.JS, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(f.Close)
	return env, f
}

// publish stores n events on subject and returns the last one's sequence.
func publish(t *testing.T, env *jstest.Env, subject string, n int) uint64 {
	t.Helper()
	var last uint64
	for i := range n {
		ack, err := env.JS.Publish(context.Background(), subject, fmt.Appendf(nil, "%d", i))
		if err != nil {
			t.Error(err)
			return 0
		}
		last = ack.Sequence
	}
	return last
}

// readUntil reads sub until the event with sequence last, and returns the
// sequences read.
func readUntil(t *testing.T, sub *Sub, last uint64) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seqs []uint64
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events (last %v): %v", len(seqs), seqs[max(len(seqs)-1, 0):], err)
		}
		seqs = append(seqs, ev.Seq)
		if ev.Seq >= last {
			return seqs
		}
	}
}

// A subscriber resuming after an event, while events keep being stored,
// gets each later event once, in order: the missed ones read from the
// stream, then the feed's, with no gap or repeat where they join.
func TestResumeJoinsTheFeedWithoutGapsOrRepeats(t *testing.T) {
	env, f := newFeed(t)
	// The feed is following before the first events, so that the resume
	// below has events to read from the stream and from the feed.
	warm, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	first := publish(t, env, "tollgate.event.test.a.t-1", 50)
	done := make(chan uint64)
	// With the 30 it resumes from the stream, fewer than a buffer's worth:
	// this subscriber reads only once they are all stored, so the resumed
	// and the live events together must fit its buffer.
	go func() { done <- publish(t, env, "tollgate.event.test.b.t-1", Buffer-40) }()
	after := first - 30
	sub, err := f.Subscribe(context.Background(), Options{After: Cursor{after}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	last := <-done
	got := readUntil(t, sub, last)
	for i, seq := range got {
		if want := after + 1 + uint64(i); seq != want {
			t.Fatalf("event %d has sequence %d, want %d: a gap or a repeat (%v)", i, seq, want, got)
		}
	}
	if len(got) != int(last-after) {
		t.Fatalf("%d events, want %d", len(got), last-after)
	}
}

// Filters select the events a subscriber gets, from the stream and from
// the feed alike.
func TestFiltersSelectTheEvents(t *testing.T) {
	env, f := newFeed(t)
	publish(t, env, "tollgate.event.x.y.t-1", 3)
	publish(t, env, "tollgate.event.x.y.t-2", 3)
	sub, err := f.Subscribe(context.Background(), Options{Filters: []string{"tollgate.event.*.*.t-2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	publish(t, env, "tollgate.event.x.y.t-1", 3)
	last := publish(t, env, "tollgate.event.x.y.t-2", 3)
	if got := readUntil(t, sub, last); len(got) != 6 {
		t.Fatalf("got %v, want the 6 events of t-2", got)
	}
}

// A subscriber that does not read is cut off once its buffer is full; the
// others get every event.
func TestASlowSubscriberIsCutOffAndBlocksNoOther(t *testing.T) {
	env, f := newFeed(t)
	slow, err := f.Subscribe(context.Background(), Options{New: true})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	n := 3 * Buffer
	// A buffer that holds them all: the fast subscriber gets every event
	// however late it is scheduled, unless the slow one holds the feed up.
	fast, err := f.Subscribe(context.Background(), Options{New: true, Buffer: n})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	last := publish(t, env, "tollgate.event.test.a.t-1", n)
	if got := readUntil(t, fast, last); len(got) != n {
		t.Fatalf("the reading subscriber got %d events, want %d", len(got), n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := 0
	for {
		_, err := slow.Next(ctx)
		if err == nil {
			read++
			continue
		}
		if !errors.Is(err, ErrSlow) {
			t.Fatalf("the slow subscriber's Next: %v, want ErrSlow", err)
		}
		break
	}
	if read > Buffer {
		t.Fatalf("the slow subscriber read %d events, more than its buffer", read)
	}
}

// An owner holds at most Max streams; another owner is not affected, and
// closing one frees its slot.
func TestStreamsPerOwnerAreCapped(t *testing.T) {
	_, f := newFeed(t)
	ctx := context.Background()
	var subs []*Sub
	for range 2 {
		s, err := f.Subscribe(ctx, Options{New: true, Owner: "k1", Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	if _, err := f.Subscribe(ctx, Options{New: true, Owner: "k1", Max: 2}); !errors.Is(err, ErrTooManyStreams) || schemas.CodeOf(err) != CodeTooManyStreams {
		t.Fatalf("a third stream of k1: %v, want ErrTooManyStreams", err)
	}
	other, err := f.Subscribe(ctx, Options{New: true, Owner: "k2", Max: 2})
	if err != nil {
		t.Fatalf("another owner: %v", err)
	}
	other.Close()
	subs[0].Close()
	subs[0].Close() // twice frees one slot only
	s, err := f.Subscribe(ctx, Options{New: true, Owner: "k1", Max: 2})
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	s.Close()
	if _, err := f.Subscribe(ctx, Options{New: true, Owner: "k1", Max: 1}); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("k1 holds 1 stream, Max 1: %v", err)
	}
	if n := f.Open("k1"); n != 1 {
		t.Fatalf("k1 holds %d streams, want 1", n)
	}
}

// A position beyond a stream's last message is INVALID_INPUT, the largest
// uint64 included, the approvals bucket's place too, and so is a cursor
// naming another number of streams than the feed's (the events stream,
// 4 turn logs, the approvals), an earlier version's (no approvals) or one;
// the last message itself is a valid position, in each form.
func TestAPositionBeyondTheStreamIsInvalid(t *testing.T) {
	env, f := newFeed(t)
	last := publish(t, env, "tollgate.event.test.a.t-1", 3)
	for _, after := range []Cursor{{last + 1}, {1 << 63}, {^uint64(0)}, {last, 0, 0, 0, 1}, {last, 0, 0, 0, 0, 1}, {last + 1, 0, 0, 0, 0, 0},
		{0, 0, 0, 0, 0, 0, 0}, {last, 0}, {last, 0, 0}, {last, 0, 0, 0, 0, splitAt(1, 1)}} {
		if _, err := f.Subscribe(context.Background(), Options{After: after}); schemas.CodeOf(err) != schemas.CodeInvalidInput {
			t.Errorf("After %s: %v, want INVALID_INPUT", after, err)
		}
	}
	for _, after := range []Cursor{{last}, {last, 0, 0, 0, 0}, {last, 0, 0, 0, 0, 0}} {
		s, err := f.Subscribe(context.Background(), Options{After: after})
		if err != nil {
			t.Fatalf("After the last event, %s: %v", after, err)
		}
		s.Close()
	}
}

// However many subscribers come and go, with or without events to read
// from the stream first, the events stream holds one consumer of the
// feed's.
func TestSubscribersShareOneConsumer(t *testing.T) {
	env, f := newFeed(t)
	ctx := jstest.Ctx(t)
	stream, err := env.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	before := consumers()
	last := publish(t, env, "tollgate.event.test.a.t-1", 5)
	for i := range 100 {
		// This version's ids, and the earlier one's, which read the
		// approvals bucket from a position a consumer of their own finds.
		after := Cursor{uint64(i % 5), 0, 0, 0, 0, 0}
		if i%2 == 1 {
			after = after[:5]
		}
		s, err := f.Subscribe(ctx, Options{After: after})
		if err != nil {
			t.Fatal(err)
		}
		readUntil(t, s, last)
		s.Close()
	}
	if n := consumers(); n != before+1 {
		t.Fatalf("%d consumers on %s after 100 subscribers came and went, want %d (one: the feed's)", n, topology.StreamEvents, before+1)
	}
	names := []string{topology.StreamApprovals}
	for i := range 4 {
		names = append(names, topology.TurnLogStream(i))
	}
	for _, name := range names {
		info, err := env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if n := info.CachedInfo().State.Consumers; n != 1 {
			t.Fatalf("%d consumers on %s, want one: the feed's", n, name)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
		{"a.b", "a.b.c", false},
		{"a.*.c", "a.x.c", true},
		{"a.*", "a.x.c", false},
		{"a.>", "a.x.c", true},
		{"a.>", "a", false},
		{">", "a", true},
		{"tollgate.event.*.*.t-1", "tollgate.event.redrive.started.t-1", true},
		{"tollgate.event.*.*.t-1", "tollgate.event.redrive.started.t-12", false},
	} {
		if got := Match(c.filter, c.subject); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}
