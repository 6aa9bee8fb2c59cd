package runner_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
)

// The consume-loop watchdog (nats.go issue #2063,
// github.com/nats-io/nats.go/issues/2063). The stall is provoked
// with runner.StallConsume, which ends the runner's consume context behind
// its back: the runner believes it is consuming, the server holds no pull
// request for it, and nothing is delivered.

const restartLog = "restarted the consume loop"

func TestStallDecision(t *testing.T) {
	const window = 30 * time.Second
	cases := []struct {
		name string
		s    runner.StallState
		want bool
	}{
		{"idle, nothing to do", runner.StallState{Idle: time.Hour, MaxAckPending: 1024}, false},
		{"pending, no pull request", runner.StallState{Idle: window, NumPending: 3, MaxAckPending: 1024}, true},
		{"pending but a delivery within the window", runner.StallState{Idle: window - time.Millisecond, NumPending: 3, MaxAckPending: 1024}, false},
		{"pending but a pull request waits (a burst just published)", runner.StallState{Idle: time.Hour, NumPending: 3, MaxAckPending: 1024, NumWaiting: 1}, false},
		{"pending, unlimited ack pending", runner.StallState{Idle: window, NumPending: 3, MaxAckPending: -1, NumAckPending: 5000, Held: 5000}, true},
		{"pending at MaxAckPending: back-pressure, not a stall", runner.StallState{Idle: time.Hour, NumPending: 3, NumAckPending: 2, MaxAckPending: 2, Held: 2}, false},
		{"every unacked message held here (slow handlers)", runner.StallState{Idle: time.Hour, NumAckPending: 7, MaxAckPending: 1024, Held: 7}, false},
		{"unacked messages not held here, no pull request (redelivery due)", runner.StallState{Idle: window, NumAckPending: 3, MaxAckPending: 1024, Held: 1}, true},
		{"unacked messages not held here, a pull request waits (a peer holds them, or a NAK delay)", runner.StallState{Idle: time.Hour, NumAckPending: 3, MaxAckPending: 1024, Held: 1, NumWaiting: 2}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why := runner.Stalled(tc.s, window)
			if got != tc.want {
				t.Fatalf("Stalled(%+v) = %v (%q), want %v", tc.s, got, why, tc.want)
			}
			if got && why == "" {
				t.Errorf("a restart without a reason")
			}
		})
	}
}

// fakeClock is the watchdog's clock in tests that drive its checks.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// manual starts a runner whose watchdog checks only when the test calls
// check, on the returned clock.
func (h *harness) manual(handler runner.Handler) (*runner.Runner, *fakeClock) {
	h.t.Helper()
	clock := newFakeClock()
	r, _ := h.start(handler, func(r *runner.Runner) {
		runner.SetClock(r, clock.Now)
		runner.ManualWatchdog(r)
	})
	h.waitConsuming(r)
	return r, clock
}

func (h *harness) waitConsuming(r *runner.Runner) {
	h.t.Helper()
	jstest.Eventually(h.t, wait, "runner consuming", func() bool { return runner.Consuming(r) })
}

func (h *harness) stall(r *runner.Runner) {
	h.t.Helper()
	if err := runner.StallConsume(r); err != nil {
		h.t.Fatalf("stall: %v", err)
	}
}

// check runs one watchdog check and returns whether it restarted.
func (h *harness) check(r *runner.Runner) bool {
	h.t.Helper()
	restarted, err := runner.CheckStall(h.ctx, r)
	if err != nil {
		h.t.Fatalf("watchdog check: %v", err)
	}
	return restarted
}

// With its own ticker and a short window, the watchdog notices a stalled
// consume loop with messages pending and restarts it; every message is then
// handled exactly once.
func TestWatchdogRestartsAStalledConsume(t *testing.T) {
	h := newHarness(t, "stalltest")
	h.cfg.StallWindow = 300 * time.Millisecond
	h.cfg.StallCheck = 20 * time.Millisecond
	h.cfg.Concurrency = 2
	seen := newCounter()
	r, _ := h.start(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		return nil
	})
	h.waitConsuming(r)
	first := h.publish(subject("s-0"), []byte("before"), nil)
	h.waitSettled(first)

	h.stall(r)
	var last uint64
	for i := range 5 {
		last = h.publish(subject(fmt.Sprintf("s-%d", i)), fmt.Appendf(nil, "after-%d", i), nil)
	}
	h.waitSettled(last)

	if got := h.metric(mRestarts); got < 1 {
		t.Fatalf("%s = %v: the messages were handled without a restart, so the stall was not one", mRestarts, got)
	}
	h.waitMetric(mAcked, 6)
	for i := range 5 {
		if n := seen.get(fmt.Sprintf("after-%d", i)); n != 1 {
			t.Errorf("after-%d handled %d times, want 1", i, n)
		}
	}
	if !strings.Contains(h.log.String(), restartLog) {
		t.Errorf("no %q log line", restartLog)
	}
}

// A restart leaves the messages the dispatcher holds where they are: a
// message whose handler is still running when the loop restarts is kept
// alive across the restart (past AckWait), handled once and acked once, while
// messages pending at the restart are delivered by the new loop.
func TestWatchdogRestartKeepsHeldMessages(t *testing.T) {
	h := newHarness(t, "heldtest")
	h.cfg.Concurrency = 2
	h.cfg.Consumer.AckWait = time.Second // the held message outlives it; InProgress must go on after the restart
	started := make(chan struct{})
	release := make(chan struct{})
	seen := newCounter()
	r, clock := h.manual(func(_ context.Context, m jetstream.Msg) error {
		if seen.see(m) == 1 && string(m.Data()) == "slow" {
			close(started)
			<-release
		}
		return nil
	})
	h.publish(subject("slow"), []byte("slow"), nil)
	select {
	case <-started:
	case <-jstest.After(wait):
		t.Fatal("the slow handler did not start")
	}

	h.stall(r)
	next := h.publish(subject("other"), []byte("next"), nil)
	// The consumer's pending count follows the stream asynchronously: the
	// check must see what it is meant to react to.
	jstest.Eventually(t, wait, "the consumer counts next as pending", func() bool { return h.consumerInfo().NumPending >= 1 })
	clock.Advance(time.Minute)
	if !h.check(r) {
		t.Fatalf("the watchdog did not restart a stalled loop with a message pending; info %+v", h.consumerInfo())
	}
	jstest.Eventually(t, wait, "next handled after the restart", func() bool { return seen.get("next") == 1 })
	h.waitMetric(mAcked, 1)

	time.Sleep(1500 * time.Millisecond) // deliberately past AckWait: the property under test is time itself
	close(release)
	h.waitSettled(next)
	h.waitMetric(mAcked, 2)
	if got := seen.seenDeliveries("slow"); fmt.Sprint(got) != "[1]" {
		t.Errorf("slow was handled on deliveries %v, want [1]: a held message must stay held across a restart", got)
	}
	if got := seen.get("next"); got != 1 {
		t.Errorf("next handled %d times, want 1", got)
	}
	if got := h.metric(mRestarts); got != 1 {
		t.Errorf("%s = %v, want 1", mRestarts, got)
	}
	if info := h.consumerInfo(); info.NumRedelivered != 0 {
		t.Errorf("%d messages redelivered", info.NumRedelivered)
	}
}

// The watchdog leaves a loop alone when a restart could not help: the
// consumer is idle, it was just busy, every unacknowledged message is held
// here, or MaxAckPending is reached. Each case is checked at a time far past
// the stall window. Finally, once the held message is acked, the same stalled
// loop is restarted: the check was live all along.
func TestWatchdogLeavesAHealthyConsumerAlone(t *testing.T) {
	h := newHarness(t, "idletest")
	h.cfg.Concurrency = 2
	h.cfg.Consumer.MaxAckPending = 1
	started := make(chan struct{})
	release := make(chan struct{})
	seen := newCounter()
	r, clock := h.manual(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "slow" {
			close(started)
			<-release
		}
		return nil
	})
	noRestart := func(what string) {
		t.Helper()
		clock.Advance(10 * time.Minute)
		if h.check(r) {
			t.Fatalf("%s: the watchdog restarted the loop; info %+v", what, h.consumerInfo())
		}
	}

	noRestart("idle, nothing stored")

	done := h.publish(subject("s-1"), []byte("quick"), nil)
	h.waitSettled(done)
	noRestart("idle after handling a message")

	h.publish(subject("slow"), []byte("slow"), nil)
	select {
	case <-started:
	case <-jstest.After(wait):
		t.Fatal("the slow handler did not start")
	}
	noRestart("the only unacknowledged message is held here")

	h.stall(r)
	noRestart("stalled, but the only unacknowledged message is held here")
	last := h.publish(subject("s-2"), []byte("blocked"), nil)
	jstest.Eventually(t, wait, "blocked pending", func() bool { return h.consumerInfo().NumPending == 1 })
	noRestart("stalled, but MaxAckPending is reached")

	if got := h.metric(mRestarts); got != 0 {
		t.Fatalf("%s = %v, want 0", mRestarts, got)
	}
	if strings.Contains(h.log.String(), restartLog) {
		t.Fatalf("a restart was logged")
	}

	close(release)
	jstest.Eventually(t, wait, "slow acked", func() bool { return h.consumerInfo().NumAckPending == 0 })
	clock.Advance(10 * time.Minute)
	if !h.check(r) {
		t.Fatalf("no restart once the stalled loop could receive the pending message; info %+v", h.consumerInfo())
	}
	h.waitSettled(last)
	if seen.get("blocked") != 1 || seen.get("slow") != 1 || seen.get("quick") != 1 {
		t.Errorf("handled quick %d, slow %d, blocked %d times; want once each", seen.get("quick"), seen.get("slow"), seen.get("blocked"))
	}
	if got := h.metric(mRestarts); got != 1 {
		t.Errorf("%s = %v, want 1", mRestarts, got)
	}
}
