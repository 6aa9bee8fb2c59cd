package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The consume-loop watchdog.
//
// nats.go's Consume can stop pulling while the connection and its
// subscription look healthy: after a consumer leader change (a 409
// "Leadership Change" status) it may send no new pull request, and the
// consumer stalls with messages pending until the process restarts
// (nats.go issue #2063, github.com/nats-io/nats.go/issues/2063, open for
// v1.55). A Consume that ends on a terminal
// error (consumer deleted, bad request) also leaves the runner waiting for
// deliveries that never come.
//
// The watchdog notices that from the server's side and does what a process
// restart would do for this consumer, without the rest of a restart: it
// ends the consume context and starts a new Consume on the same durable,
// feeding the same dispatcher.
//
// Signal. Every StallCheck, if nothing has been delivered to this runner for
// StallWindow (counted from the last delivery or the last (re)start), it
// reads the consumer's info and restarts when the server holds no pull
// request for the consumer (NumWaiting 0) while there is work a pull request
// would receive:
//
//   - NumPending > 0 with NumAckPending below MaxAckPending (at the limit
//     the server delivers nothing new to anyone: that is back-pressure from
//     held messages, not a stall), or
//   - more unacknowledged messages than this runner holds: messages whose
//     AckWait or NAK delay runs out are redelivered only to a waiting pull
//     request.
//
// NumWaiting 0 is the stall itself as the server sees it: nobody is asking
// for messages. A healthy Consume always has a pull request waiting, except
// for the round trip between one expiring and the next. Requiring it keeps
// a burst published just as an idle runner is checked, a peer replica
// holding messages, or a NAK delay from reading as a stall.
//
// Safety. A restart drains the old consume context (messages already
// received are handed to the dispatcher; only if the drain does not finish
// within drainWait is it stopped, leaving anything still buffered to be
// redelivered after AckWait), then starts a new Consume on the same durable.
// Messages the dispatcher holds stay held: they are still kept alive with
// InProgress and settled with their own reply subjects, which do not depend
// on the subscription that received them. The server redelivers nothing
// because of a restart; anything it redelivers (AckWait or NAK delay run
// out) was due anyway. Delivery stays at least once, as always.
//
// Limit. With several replicas, NumWaiting counts every replica's pull
// requests: a replica whose loop stalled while its peers keep the consumer
// drained is not restarted (the work is done; capacity is reduced) until
// work waits with no pull request at all.

// Watchdog defaults.
const (
	DefaultStallWindow = 30 * time.Second
	DefaultStallCheck  = 5 * time.Second
	// drainWait bounds how long a restart waits for the old consume context
	// to finish handing over what it already received.
	drainWait = 5 * time.Second
)

// stallState is what the watchdog decides on.
type stallState struct {
	Idle          time.Duration // since the last delivery to this runner or its last (re)start
	NumPending    uint64        // messages not yet delivered to anyone
	NumAckPending int           // delivered, not yet acknowledged
	MaxAckPending int           // the consumer's limit; <= 0 is unlimited
	NumWaiting    int           // pull requests the server holds for the consumer
	Held          int           // messages this runner holds: queued or running
}

// stalled reports whether s, after window without a delivery, calls for a
// restart, and why.
func stalled(s stallState, window time.Duration) (bool, string) {
	if s.Idle < window || s.NumWaiting > 0 {
		return false, ""
	}
	if s.NumPending > 0 && (s.MaxAckPending <= 0 || s.NumAckPending < s.MaxAckPending) {
		return true, fmt.Sprintf("%d messages pending and no pull request", s.NumPending)
	}
	if s.NumAckPending > s.Held {
		return true, fmt.Sprintf("%d unacknowledged messages not held here and no pull request", s.NumAckPending-s.Held)
	}
	return false, ""
}

// consumeLoop is the runner's consume context, which the watchdog may
// replace, and the time of its last delivery.
type consumeLoop struct {
	r    *Runner
	cons jetstream.Consumer
	d    *dispatcher

	mu sync.Mutex
	cc jetstream.ConsumeContext // nil after a restart whose Consume failed

	active atomic.Int64 // r.now() in Unix ns: last delivery, or last (re)start
}

func (l *consumeLoop) touch() { l.active.Store(l.r.now().UnixNano()) }

// start starts a Consume. l.mu must be held, or l not yet shared.
func (l *consumeLoop) start() error {
	c := l.r.cfg
	cc, err := l.cons.Consume(func(m jetstream.Msg) {
		l.touch()
		l.d.submit(c.ShardKey(m), m)
	},
		jetstream.PullMaxMessages(256),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrNoHeartbeat):
				c.Logger.Warn("consume heartbeat missed", "err", err)
			case errors.Is(err, jetstream.ErrConsumerLeadershipChanged):
				// nats.go may not pull again after this (issue #2063);
				// the watchdog restarts consuming if deliveries stall.
				c.Logger.Warn("consumer leadership changed", "err", err)
			default:
				c.Logger.Debug("consume error", "err", err)
			}
		}),
	)
	if err != nil {
		return err
	}
	l.cc = cc
	l.touch()
	return nil
}

// current returns the consume context in use, or nil.
func (l *consumeLoop) current() jetstream.ConsumeContext {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cc
}

// restart ends the current consume context, handing what it already received
// to the dispatcher, and starts a new Consume on the same consumer.
func (l *consumeLoop) restart() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.cc; old != nil {
		l.cc = nil
		old.Drain()
		t := time.NewTimer(drainWait)
		select {
		case <-old.Closed():
		case <-t.C:
			old.Stop()
		}
		t.Stop()
	}
	return l.start()
}

// watch runs check every StallCheck until ctx is cancelled.
func (l *consumeLoop) watch(ctx context.Context) {
	c := l.r.cfg
	if c.StallWindow < 0 || l.r.manualWatchdog {
		return
	}
	t := time.NewTicker(c.StallCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = l.check(ctx)
		}
	}
}

// check restarts consuming if it has stalled (see stalled) and reports
// whether it did.
func (l *consumeLoop) check(ctx context.Context) (bool, error) {
	c := l.r.cfg
	idle := l.r.now().Sub(time.Unix(0, l.active.Load()))
	if idle < c.StallWindow {
		return false, nil // deliveries are flowing: no need to ask the server
	}
	ictx, cancel := context.WithTimeout(ctx, max(c.StallCheck, time.Second))
	info, err := l.cons.Info(ictx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.Logger.Warn("consume watchdog: consumer info failed", "err", err)
		}
		return false, err
	}
	s := stallState{
		Idle:          idle,
		NumPending:    info.NumPending,
		NumAckPending: info.NumAckPending,
		MaxAckPending: info.Config.MaxAckPending,
		NumWaiting:    info.NumWaiting,
		Held:          l.d.heldCount(),
	}
	stall, why := stalled(s, c.StallWindow)
	if !stall {
		return false, nil
	}
	log := c.Logger.With("idle", idle.Round(time.Millisecond), "num_pending", s.NumPending,
		"num_ack_pending", s.NumAckPending, "held", s.Held, "why", why)
	if err := l.restart(); err != nil {
		log.Error("consume watchdog: consuming stalled and could not be restarted; will retry", "err", err)
		return false, err
	}
	c.Metrics.ConsumeRestarts.WithLabelValues(c.Component).Inc()
	log.Warn("consume watchdog: consuming stalled; restarted the consume loop")
	return true, nil
}
