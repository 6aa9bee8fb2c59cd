package runner

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// dispatcher runs messages with up to n workers, keeping messages of one key
// in delivery order and never letting one key hold up another: a key whose
// message is slow waits alone, its later messages queued behind it, while
// the other workers take other keys. Submitting never blocks (the consumer's
// MaxAckPending bounds what can be held). Every held message, running or
// queued, is kept alive with InProgress so that waiting in a queue does not
// run out its AckWait.
type dispatcher struct {
	mu       sync.Mutex
	cond     *sync.Cond
	queues   map[string][]jetstream.Msg // per key: head is running or next to run
	held     map[jetstream.Msg]struct{} // kept alive: queued, or running and not yet settled
	runnable []string                   // keys whose head may run now, FIFO
	draining bool                       // finish what is held, then stop
	abandon  bool                       // stop after the current messages
	wg       sync.WaitGroup
}

func newDispatcher(n int, handle func(m jetstream.Msg, release func())) *dispatcher {
	d := &dispatcher{queues: map[string][]jetstream.Msg{}, held: map[jetstream.Msg]struct{}{}}
	d.cond = sync.NewCond(&d.mu)
	for range n {
		d.wg.Add(1)
		go d.work(handle)
	}
	return d
}

// submit queues m under key. A key not yet held becomes runnable at once.
func (d *dispatcher) submit(key string, m jetstream.Msg) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.abandon {
		return // not acked: the server redelivers it
	}
	q := d.queues[key]
	d.queues[key] = append(q, m)
	d.held[m] = struct{}{}
	if len(q) == 0 {
		d.runnable = append(d.runnable, key)
		d.cond.Signal()
	}
}

func (d *dispatcher) work(handle func(m jetstream.Msg, release func())) {
	defer d.wg.Done()
	d.mu.Lock()
	for {
		for len(d.runnable) == 0 && !d.draining && !d.abandon {
			d.cond.Wait()
		}
		if d.abandon || len(d.runnable) == 0 {
			d.mu.Unlock()
			return
		}
		key := d.runnable[0]
		d.runnable = d.runnable[1:]
		m := d.queues[key][0]
		d.mu.Unlock()

		handle(m, func() { d.release(m) })

		d.mu.Lock()
		q := d.queues[key][1:]
		if len(q) == 0 {
			delete(d.queues, key)
		} else {
			d.queues[key] = q
			d.runnable = append(d.runnable, key) // behind keys already waiting: fair
			d.cond.Signal()
		}
	}
}

// keepAlive signals InProgress on every held message each period until
// stop is closed.
func (d *dispatcher) keepAlive(period time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			d.mu.Lock()
			held := make([]jetstream.Msg, 0, len(d.held))
			for m := range d.held {
				held = append(held, m)
			}
			d.mu.Unlock()
			for _, m := range held {
				_ = m.InProgress()
			}
		}
	}
}

// heldCount is how many messages are held: queued, or running and not yet
// settled.
func (d *dispatcher) heldCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held)
}

// release stops keeping m alive; the runner calls it before settling m.
func (d *dispatcher) release(m jetstream.Msg) {
	d.mu.Lock()
	delete(d.held, m)
	d.mu.Unlock()
}

// drain lets the workers finish every held message, then waits for them.
func (d *dispatcher) drain() {
	d.mu.Lock()
	d.draining = true
	d.cond.Broadcast()
	d.mu.Unlock()
	d.wg.Wait()
}

// stop makes the workers return after their current message, leaving
// queued ones unacknowledged for redelivery, and waits for them.
func (d *dispatcher) stop() {
	d.mu.Lock()
	d.abandon = true
	for _, q := range d.queues {
		for _, m := range q[1:] { // abandoned to redelivery: stop keeping them
			delete(d.held, m)
		}
	}
	d.cond.Broadcast()
	d.mu.Unlock()
	d.wg.Wait()
}
