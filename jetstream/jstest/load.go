package jstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Load publishes messages asynchronously, as a busy transport would, and
// records which publishes the server acknowledged and at which stream
// sequence. A publish that fails or is not acknowledged in time (the server
// restarting under it) is recorded as failed; Resend publishes those again
// with the same message ids, as a transport retrying would, until each is
// acknowledged. Every message must carry a Nats-Msg-Id header.
type Load struct {
	t  testing.TB
	js jetstream.JetStream

	mu      sync.Mutex
	acked   map[string]uint64 // message id -> stream sequence in its ack
	byID    map[string]*nats.Msg
	failed  []string
	pending int // published, not yet acknowledged or failed
	done    chan struct{}

	holdAfter int           // the publisher waits after this many messages
	release   chan struct{} // closed by RestartMidLoad (or Wait) to let it go on
	once      sync.Once
}

// LoadWindow bounds the unacknowledged publishes of a Load. An unbounded
// async publisher can stall nats.go.
const LoadWindow = 128

// StartLoad starts publishing msgs on nc in the background. Acks that do not
// come within ackTimeout count as failed.
//
// With holdAfter > 0 the publisher stops after its first holdAfter messages
// and goes on only when RestartMidLoad restarts the server under the rest
// (or Wait is called), so the restart is mid-load however fast or slow the
// machine: a publisher left to run could finish its last message, or see
// it time out, before a poll for the acks it waits for looks again. That
// flaked on a slow CI machine ("172 publishes acknowledged, none left").
func StartLoad(t testing.TB, nc *nats.Conn, ackTimeout time.Duration, msgs []*nats.Msg, holdAfter int) *Load {
	t.Helper()
	if holdAfter < 0 || holdAfter >= len(msgs) {
		t.Fatalf("jstest: load: hold after %d of %d messages", holdAfter, len(msgs))
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackTimeout), jetstream.WithPublishAsyncMaxPending(LoadWindow))
	if err != nil {
		t.Fatalf("jstest: load: %v", err)
	}
	l := &Load{t: t, js: js, acked: map[string]uint64{}, byID: map[string]*nats.Msg{}, done: make(chan struct{}),
		holdAfter: holdAfter, release: make(chan struct{})}
	if holdAfter == 0 {
		l.letGo()
	}
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if id == "" || l.byID[id] != nil {
			t.Fatalf("jstest: load: message on %s without a unique %s", m.Subject, jetstream.MsgIDHeader)
		}
		l.byID[id] = m
	}
	futures := make(chan jetstream.PubAckFuture, LoadWindow)
	go func() {
		defer close(futures)
		for i, m := range msgs {
			if i == holdAfter {
				<-l.release
			}
			id := m.Header.Get(jetstream.MsgIDHeader)
			l.mu.Lock()
			l.pending++
			l.mu.Unlock()
			f, err := js.PublishMsgAsync(m)
			for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				// The window is full: back-pressure, as for a real
				// transport. PublishMsgAsync waited before saying so.
				f, err = js.PublishMsgAsync(m)
			}
			if err != nil {
				l.settle(id, 0, err)
				continue
			}
			futures <- f
		}
	}()
	go func() {
		defer close(l.done)
		for f := range futures {
			id := f.Msg().Header.Get(jetstream.MsgIDHeader)
			select {
			case ack := <-f.Ok():
				l.settle(id, ack.Sequence, nil)
			case err := <-f.Err():
				l.settle(id, 0, err)
			}
		}
	}()
	return l
}

func (l *Load) letGo() { l.once.Do(func() { close(l.release) }) }

func (l *Load) settle(id string, seq uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending--
	if err != nil {
		l.failed = append(l.failed, id)
		return
	}
	l.acked[id] = seq
}

// Acked returns how many publishes have been acknowledged so far.
func (l *Load) Acked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// InFlight returns how many publishes await their ack.
func (l *Load) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

// Unsettled returns how many messages are neither acknowledged nor failed
// yet: those awaiting their ack and those not yet sent.
func (l *Load) Unsettled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byID) - len(l.acked) - len(l.failed)
}

// settled returns how many publishes are acknowledged or failed.
func (l *Load) settled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked) + len(l.failed)
}

// RestartMidLoad waits until the publishes before the load's hold are
// settled (acknowledged, or failed: an ack can time out on a slow machine,
// and Resend sends those again), lets the publisher go on, waits until it
// has a publish awaiting its ack or settled, and restarts e's server
// (Env.Restart) under the rest. It returns how many publishes were
// acknowledged and how many unsettled (awaiting their ack, or not yet sent)
// when it restarted. The load must have been started with a hold.
func (l *Load) RestartMidLoad(e *Env) (ackedBefore, unsettled int) {
	l.t.Helper()
	if l.holdAfter == 0 {
		l.t.Fatal("jstest: load: RestartMidLoad needs a load started with a hold")
	}
	Eventually(l.t, LongWait, fmt.Sprintf("the first %d publishes settled", l.holdAfter), func() bool { return l.settled() >= l.holdAfter })
	l.letGo()
	Eventually(l.t, LongWait, "a publish after the hold", func() bool { return l.InFlight() > 0 || l.settled() > l.holdAfter })
	ackedBefore, unsettled = l.Acked(), l.Unsettled()
	e.Restart(l.t)
	return ackedBefore, unsettled
}

// Wait waits until every publish is acknowledged or failed and returns the
// acknowledged ones (message id -> stream sequence) and the failed ids.
func (l *Load) Wait() (acked map[string]uint64, failed []string) {
	l.t.Helper()
	l.letGo()
	select {
	case <-l.done:
	case <-After(LongWait):
		l.t.Fatalf("jstest: load: publishes still unsettled after %v", Scale(LongWait))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	acked = make(map[string]uint64, len(l.acked))
	for id, seq := range l.acked {
		acked[id] = seq
	}
	return acked, append([]string(nil), l.failed...)
}

// Resend publishes each failed message again, synchronously and with its
// message id, until it is acknowledged, and records its ack. An ack for a
// message the server had already stored (its first ack was lost) is a
// duplicate ack carrying the first copy's sequence. It returns how many
// acks were duplicates.
func (l *Load) Resend(ctx context.Context) (duplicates int) {
	l.t.Helper()
	_, failed := l.Wait()
	for _, id := range failed {
		m := l.byID[id]
		for {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ack, err := l.js.PublishMsg(actx, m)
			cancel()
			if err == nil {
				if ack.Duplicate {
					duplicates++
				}
				l.mu.Lock()
				l.acked[id] = ack.Sequence
				l.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				l.t.Fatalf("jstest: load: resend %s: %v", id, errors.Join(err, ctx.Err()))
			}
		}
	}
	l.mu.Lock()
	l.failed = nil
	l.mu.Unlock()
	return duplicates
}
