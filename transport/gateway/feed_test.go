package gateway

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
)

// The batches feed wakes the requests waiting on a turn when its record is
// written, and only those.
func TestTheBatchesFeedWakesOnlyTheTurnWritten(t *testing.T) {
	env := jstest.Start(t)
	kv := env.Buckets.Batches
	var f batchFeed
	mine, _, stopMine, err := f.wait(env.NC, kv.Bucket(), "t-mine")
	if err != nil {
		t.Fatal(err)
	}
	defer stopMine()
	other, _, stopOther, err := f.wait(env.NC, kv.Bucket(), "t-other")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()

	ctx := jstest.Ctx(t)
	if _, err := kv.Put(ctx, "t-mine", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-mine.ch:
	case <-jstest.After(jstest.Wait):
		t.Fatal("no wake for a write to the waited-on turn")
	}
	// A later write to the other turn, then its wake, proves the first
	// write's report has been handled: the other waiter saw only its own.
	if _, err := kv.Put(ctx, "t-other", []byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-other.ch:
	case <-jstest.After(jstest.Wait):
		t.Fatal("no wake for a write to the other turn")
	}
	select {
	case <-other.ch:
		t.Fatal("the other turn's waiter was woken twice, once by a write to t-mine")
	case <-mine.ch:
		t.Fatal("t-mine's waiter was woken by a write to t-other")
	default:
	}

	stopMine()
	if _, err := kv.Put(ctx, "t-mine", []byte("z")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "t-other", []byte("w")); err != nil {
		t.Fatal(err)
	}
	<-other.ch // the later fact
	if got := string(other.take()); got != "w" {
		t.Fatalf("the waiter's latest write = %q, want the body written, %q", got, "w")
	}
	select {
	case <-mine.ch:
		t.Fatal("a stopped waiter was woken")
	default:
	}
}

// A request that starts waiting on a turn written a moment ago starts from
// the write the feed kept, and hears every later one; a deleted key's write
// is forgotten.
func TestTheBatchesFeedKeepsTheLatestWriteOfARecentTurn(t *testing.T) {
	env := jstest.Start(t)
	kv := env.Buckets.Batches
	ctx := jstest.Ctx(t)
	var f batchFeed
	// The first waiter starts the subscription; its turn has no write yet.
	first, latest, stopFirst, err := f.wait(env.NC, kv.Bucket(), "t-1")
	if err != nil {
		t.Fatal(err)
	}
	defer stopFirst()
	if latest != nil {
		t.Fatalf("latest write of an unwritten turn = %q, want none", latest)
	}
	for _, v := range []string{"a", "b"} {
		if _, err := kv.Put(ctx, "t-1", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	jstest.EventuallyState(t, jstest.Wait, `the waiter sees "b"`, func() (bool, string) {
		latest := first.take()
		return string(latest) == "b", fmt.Sprintf("latest %q", latest)
	})

	_, latest, stop, err := f.wait(env.NC, kv.Bucket(), "t-1")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if string(latest) != "b" {
		t.Fatalf("a new waiter starts from %q, want the latest write %q", latest, "b")
	}

	if err := kv.Delete(ctx, "t-1"); err != nil {
		t.Fatal(err)
	}
	// The delete's report is handled before a later write's.
	if _, err := kv.Put(ctx, "t-2", []byte("later")); err != nil {
		t.Fatal(err)
	}
	jstest.Eventually(t, jstest.Wait, "the write to t-2 is kept", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, kept := f.latest.get("t-2")
		return kept
	})
	_, latest, stop, err = f.wait(env.NC, kv.Bucket(), "t-1")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if latest != nil {
		t.Fatalf("a deleted turn's write is still kept: %q", latest)
	}
}

// The batches feed hears every batch written now as an append to its
// turn's log, and wakes the requests waiting on that turn, and only
// those; it keeps the append's record for a request that starts waiting
// later; and it still hears a write of an earlier version's batch in the
// bucket.
func TestTheBatchesFeedWakesOnATurnLogAppend(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	log := turnlog.Bind(env.JS, env.Buckets.TurnLogs)
	var f batchFeed
	mine, _, stopMine, err := f.wait(env.NC, env.Buckets.Batches.Bucket(), "t-log")
	if err != nil {
		t.Fatal(err)
	}
	defer stopMine()
	other, _, stopOther, err := f.wait(env.NC, env.Buckets.Batches.Bucket(), "t-other")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()

	seq, err := log.Append(ctx, turnlog.Append{Turn: "t-log", Event: "running", Data: []byte("running")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(ctx, turnlog.Append{Turn: "t-log", Event: "completed", After: seq, Data: []byte("completed")}); err != nil {
		t.Fatal(err)
	}
	jstest.EventuallyState(t, jstest.Wait, "the waiter sees the turn's last event", func() (bool, string) {
		latest := mine.take()
		return string(latest) == "completed", fmt.Sprintf("latest %q", latest)
	})
	select {
	case <-mine.ch:
	default:
		t.Fatal("no wake for an append to the waited-on turn's log")
	}
	// An earlier version's batch of the other turn, in the bucket: its
	// wake, after the appends', proves they were handled and reached
	// only t-log's waiter.
	if _, err := env.Buckets.Batches.Put(ctx, "t-other", []byte("bucketed")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-other.ch:
	case <-jstest.After(jstest.Wait):
		t.Fatal("no wake for a write of the other turn's batch in the bucket")
	}
	if got := string(other.take()); got != "bucketed" {
		t.Fatalf("the other waiter's latest write = %q, want %q", got, "bucketed")
	}
	select {
	case <-mine.ch:
		t.Fatal("t-log's waiter was woken by the other turn's write")
	default:
	}

	_, latest, stop, err := f.wait(env.NC, env.Buckets.Batches.Bucket(), "t-log")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if string(latest) != "completed" {
		t.Fatalf("a new waiter starts from %q, want the turn's last event %q", latest, "completed")
	}
}

// recent keeps the values of the keys set last, and no more.
func TestRecentKeepsTheKeysSetLast(t *testing.T) {
	var r recent[int]
	for i := range 5 {
		r.set(fmt.Sprint("k", i), i, 3)
	}
	r.set("k4", 40, 3) // an update takes no new slot
	for key, want := range map[string]int{"k2": 2, "k3": 3, "k4": 40} {
		if v, ok := r.get(key); !ok || v != want {
			t.Errorf("%s = %d, %v; want %d", key, v, ok, want)
		}
	}
	for _, key := range []string{"k0", "k1"} {
		if _, ok := r.get(key); ok {
			t.Errorf("%s is kept past the limit", key)
		}
	}
	r.drop("k3")
	if _, ok := r.get("k3"); ok {
		t.Error("a dropped key is kept")
	}
	if len(r.vals) > 3 {
		t.Errorf("%d values kept, want at most 3", len(r.vals))
	}
}

// The event feed hands each event to the requests waiting on its subject,
// and only to them.
func TestTheEventFeedHandsEventsToTheirWaiters(t *testing.T) {
	env := jstest.Start(t)
	var f eventFeed
	patterns := []string{"test.a.*", "test.b.*"}
	mine, stopMine, err := f.wait(env.NC, patterns, "test.a.1", "test.b.x")
	if err != nil {
		t.Fatal(err)
	}
	defer stopMine()
	other, stopOther, err := f.wait(env.NC, patterns, "test.a.2")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()
	for _, subj := range []string{"test.a.1", "test.b.x", "test.a.2"} {
		if err := env.NC.Publish(subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	got := func(ch <-chan *nats.Msg) string {
		select {
		case m := <-ch:
			return m.Subject
		case <-jstest.After(jstest.Wait):
			return "nothing"
		}
	}
	// Each pattern has its own subscription, so the two may come in
	// either order.
	if a, b := got(mine), got(mine); !(a == "test.a.1" && b == "test.b.x") && !(a == "test.b.x" && b == "test.a.1") {
		t.Fatalf("the waiter on two subjects got %s, %s; want test.a.1 and test.b.x", a, b)
	}
	if s := got(other); s != "test.a.2" {
		t.Fatalf("the other waiter got %s, want test.a.2", s)
	}
	select {
	case m := <-mine:
		t.Fatalf("the waiter got another's event %s", m.Subject)
	default:
	}
	stopOther()
	if err := env.NC.Publish("test.a.2", nil); err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Publish("test.a.1", nil); err != nil {
		t.Fatal(err)
	}
	if s := got(mine); s != "test.a.1" {
		t.Fatalf("got %s, want test.a.1", s)
	}
	select {
	case m := <-other:
		t.Fatalf("a stopped waiter got %s", m.Subject)
	default:
	}
}
