package gateway

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// The batches feed wakes the requests waiting on a turn when its record is
// written, and only those.
func TestTheBatchesFeedWakesOnlyTheTurnWritten(t *testing.T) {
	env := jstest.Start(t)
	kv := env.Buckets.Batches
	var f batchFeed
	mine, stopMine, err := f.wait(env.NC, kv.Bucket(), "t-mine")
	if err != nil {
		t.Fatal(err)
	}
	defer stopMine()
	other, stopOther, err := f.wait(env.NC, kv.Bucket(), "t-other")
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
	case <-time.After(10 * time.Second):
		t.Fatal("no wake for a write to the waited-on turn")
	}
	// A later write to the other turn, then its wake, proves the first
	// write's report has been handled: the other waiter saw only its own.
	if _, err := kv.Put(ctx, "t-other", []byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-other.ch:
	case <-time.After(10 * time.Second):
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
