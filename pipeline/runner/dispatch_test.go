package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A key whose handler is slow holds only itself up: its later messages wait
// behind it (in order, kept alive past AckWait), while every other key is
// handled meanwhile — even with a single spare worker.
func TestASlowKeyHoldsUpOnlyItself(t *testing.T) {
	h := newHarness(t, "holtest")
	h.cfg.Concurrency = 2
	h.cfg.Consumer.AckWait = time.Second // queued messages outlive it; InProgress must keep them

	release := make(chan struct{})
	var mu sync.Mutex
	var handled []string
	deliveries := map[string]uint64{}
	h.run(func(_ context.Context, m jetstream.Msg) error {
		body := string(m.Data())
		if body == "slow/0" {
			<-release
		}
		meta, _ := m.Metadata()
		mu.Lock()
		handled = append(handled, body)
		if meta != nil && meta.NumDelivered > deliveries[body] {
			deliveries[body] = meta.NumDelivered
		}
		mu.Unlock()
		return nil
	})

	h.publish(subject("slow"), []byte("slow/0"), nil)
	h.publish(subject("slow"), []byte("slow/1"), nil)
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		h.publish(subject(k), []byte(k+"/0"), nil)
	}
	h.waitMetric(mAcked, 6) // every other key is done while slow/0 still runs

	mu.Lock()
	for _, b := range handled {
		if strings.HasPrefix(b, "slow/") {
			mu.Unlock()
			t.Fatalf("%s handled while slow/0 was still running: %v", b, handled)
		}
	}
	mu.Unlock()

	// Hold slow/1 in its queue for longer than AckWait, then let slow/0 go.
	time.Sleep(2500 * time.Millisecond) // deliberately past AckWait: the property under test is time itself
	close(release)
	h.waitMetric(mAcked, 8)

	mu.Lock()
	defer mu.Unlock()
	i0, i1 := indexOf(handled, "slow/0"), indexOf(handled, "slow/1")
	if i0 < 0 || i1 < 0 || i1 < i0 {
		t.Fatalf("slow key handled out of order: %v", handled)
	}
	if n := deliveries["slow/1"]; n != 1 {
		t.Fatalf("slow/1 was delivered %d times; a queued message must be kept alive, not redelivered", n)
	}
	if n := len(handled); n != 8 {
		t.Fatalf("%d handler calls for 8 messages: %v", n, handled)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// If the stage cannot close out a message's work before it is
// dead-lettered, the message is not given up: it is NAKed and the hook runs
// again on the next delivery, and only then is it dead-lettered.
func TestAFailedDeadLetterHookRetriesInsteadOfGivingUp(t *testing.T) {
	h := newHarness(t, "hooktest")
	h.cfg.MaxDelay = 50 * time.Millisecond
	var mu sync.Mutex
	var calls []uint64
	h.cfg.OnDeadLetter = func(_ context.Context, m jetstream.Msg, code schemas.Code, _ error) error {
		meta, _ := m.Metadata()
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, meta.NumDelivered)
		if code != schemas.CodeMalformed {
			t.Errorf("hook got code %s", code)
		}
		if len(calls) == 1 {
			return errors.New("KV unavailable")
		}
		return nil
	}
	h.run(func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodeMalformed, "bad")
	})
	h.publish(subject("hook"), []byte("x"), nil)
	dl := h.waitDeadLetters(1)
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || calls[0] != 1 || calls[1] != 2 {
		t.Fatalf("hook ran on deliveries %v, want [1 2]", calls)
	}
	if got := dl[0].Header.Get(runner.HeaderDeliveries); got != "2" {
		t.Fatalf("dead-lettered on delivery %s, want 2 (after the hook succeeded)", got)
	}
}
