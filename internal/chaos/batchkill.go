package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/groupcommit"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
)

// The batch kill fault (Config.BatchKills): the broker is SIGKILLed while
// a large atomic batch of turns is being committed, and the run checks
// that the batch's turns were stored all or none, each exactly once.
//
// The harness publishes the turns' inbound messages the way a transport
// with a group committer would: through a jetstream/groupcommit committer
// on TOLLGATE_INBOUND, each with its Nats-Msg-Id, retried with the same id
// until acknowledged. For a batch kill it holds the next turns it publishes
// at a gate until batchGather of them wait (or batchGatherWait passes) and
// lets them go together, so that they meet in one atomic batch. The
// committer's OnBatch hook sees the batch just before its commit message
// goes out and, when it holds at least batchKillMin writes, SIGKILLs
// nats-server there: the commit races the kill, so the server dies before,
// during or after storing the batch, and before its acknowledgement. The
// supervisor restarts it after the fault's downtime; the writers learn the
// outcome as any publisher does (an error and a retry with the same id,
// deduplicated, or the answers to the batch's writes sent again singly).
// After the run, TOLLGATE_INBOUND must hold every message of the batch or
// none (its Nats-Batch-Id and Nats-Batch-Sequence are stored with each
// message), and each of its turns exactly once; the usual checks then show
// none of them lost or run twice.

// batchGatherWait bounds the wait at the gate, and batchTries the gates
// opened for one fault before it gives up (no batch large enough formed).
const (
	batchGatherWait = 5 * time.Second
	batchTries      = 4
)

// batchGather is how many turns the gate gathers, and batchKillMin the
// fewest writes of a batch the fault kills the broker in: a large batch
// for the run's concurrency (the first turn released goes alone while the
// others gather).
func (c Config) batchGather() int  { return max(4, min(24, c.Concurrency*3/4)) }
func (c Config) batchKillMin() int { return max(3, c.batchGather()/2) }

// KilledBatch is one atomic batch of turns the broker was killed in.
type KilledBatch struct {
	ID     string   // Nats-Batch-Id
	MsgIDs []string // the turns' inbound message ids, in batch order
	At     time.Time
}

// BatchFact is what TOLLGATE_INBOUND holds of a KilledBatch after the run.
type BatchFact struct {
	KilledBatch
	// StoredSeqs are the Nats-Batch-Sequence values of the stored messages
	// carrying the batch's id, sorted.
	StoredSeqs []int
	// Stored is, per message id of the batch, how many stored messages
	// carry it (the batch's own or a later single retry's).
	Stored map[string]int
}

// batchKiller is the harness's side of the fault: the gate before the
// inbound publishes and the committer hook that kills the broker.
type batchKiller struct {
	h *harness

	mu      sync.Mutex
	gateOn  bool
	waiting int
	release chan struct{}

	armed  atomic.Bool
	killed chan KilledBatch // the hook's batch, once it killed the broker
	// down and delay are the armed fault's downtime and KillDelay.
	down, delay time.Duration

	batches []KilledBatch // guarded by mu
}

func newBatchKiller(h *harness) *batchKiller {
	return &batchKiller{h: h, killed: make(chan KilledBatch, 1)}
}

// wait holds a publish while the gate is on, until batchGather publishes
// wait or the gate's time is up.
func (k *batchKiller) wait(ctx context.Context) {
	k.mu.Lock()
	if !k.gateOn {
		k.mu.Unlock()
		return
	}
	k.waiting++
	ch := k.release
	if k.waiting >= k.h.cfg.batchGather() {
		k.gateOn = false
		close(ch)
	}
	k.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// hold turns the gate on (publishes wait at it), and off again after
// batchGatherWait unless enough publishes came first.
func (k *batchKiller) hold() {
	k.mu.Lock()
	k.gateOn, k.waiting, k.release = true, 0, make(chan struct{})
	ch := k.release
	k.mu.Unlock()
	time.AfterFunc(batchGatherWait, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.gateOn && k.release == ch {
			k.gateOn = false
			close(ch)
		}
	})
}

// onBatch is the inbound committer's groupcommit.Config.OnBatch: armed, it
// SIGKILLs the broker as a batch of at least batchKillMin turns is about
// to be committed (or the fault's KillDelay later), without waiting for it
// to die: the commit message goes out as it dies.
func (k *batchKiller) onBatch(b groupcommit.Batch) {
	if b.Stream != topology.StreamInbound || len(b.Subjects) < k.h.cfg.batchKillMin() || !k.armed.CompareAndSwap(true, false) {
		return
	}
	kb := KilledBatch{ID: b.ID, MsgIDs: slices.Clone(b.MsgIDs), At: time.Now()}
	down := k.down
	kill := func() {
		if err := k.h.nodes[0].slot.killNow(down); err != nil {
			k.h.logf("batch kill: %v", err)
		}
	}
	if k.delay > 0 {
		time.AfterFunc(k.delay, kill)
	} else {
		kill()
	}
	k.mu.Lock()
	k.batches = append(k.batches, kb)
	k.mu.Unlock()
	k.killed <- kb
}

// killed returns the batches the broker was killed in.
func (k *batchKiller) killedBatches() []KilledBatch {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.batches)
}

// batchKill performs one batch kill fault: it gathers turns at the gate
// until the hook has killed the broker in a large batch (batchTries
// gates at most), then waits until the restarted broker accepts
// connections.
func (h *harness) batchKill(ctx context.Context, f Fault) error {
	k := h.batches
	nd := h.nodes[0]
	killed, err := nd.slot.waitUp(ctx)
	if err != nil {
		return err
	}
	select { // a kill of an earlier fault's last moment
	case <-k.killed:
	default:
	}
	k.down, k.delay = f.Down, f.KillDelay
	k.armed.Store(true)
	defer k.armed.Store(false)
	for try := 1; ; try++ {
		k.hold()
		select {
		case kb := <-k.killed:
			h.mu.Lock()
			h.restarts++
			h.batchKills++
			h.lastFault = time.Now()
			h.mu.Unlock()
			h.logf("batch kill: nats-server SIGKILLed as a batch of %d turns (%s) commits", len(kb.MsgIDs), kb.ID)
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			select {
			case <-killed.Done():
			case <-wctx.Done():
				return fmt.Errorf("nats-server did not exit after SIGKILL: %w", wctx.Err())
			}
			p, err := nd.slot.waitUp(wctx)
			if err != nil {
				return err
			}
			return waitTCP(wctx, nd.addr(), p)
		case <-time.After(batchGatherWait + 5*time.Second):
			if try == batchTries {
				h.mu.Lock()
				h.batchMisses++
				h.mu.Unlock()
				return fmt.Errorf("no batch of %d or more turns formed in %d tries: no kill", h.cfg.batchKillMin(), try)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// gatherBatches reads what TOLLGATE_INBOUND holds of the killed batches.
func (h *harness) gatherBatches(ctx context.Context, js jetstream.JetStream) ([]BatchFact, error) {
	kbs := h.batches.killedBatches()
	if len(kbs) == 0 {
		return nil, nil
	}
	facts := make([]BatchFact, len(kbs))
	// A turn can be in two killed batches: a writer of the first retries
	// and its retry meets the second.
	byBatch, byMsgID := map[string]*BatchFact{}, map[string][]*BatchFact{}
	for i, kb := range kbs {
		facts[i] = BatchFact{KilledBatch: kb}
		byBatch[kb.ID] = &facts[i]
		for _, id := range kb.MsgIDs {
			byMsgID[id] = append(byMsgID[id], &facts[i])
		}
	}
	err := topology.Retry(ctx, func() error {
		for i := range facts {
			facts[i].StoredSeqs, facts[i].Stored = nil, map[string]int{}
		}
		return bus.Scan(ctx, js, topology.StreamInbound, topology.SubjectInboundPrefix+">", func(m jetstream.Msg) error {
			if f := byBatch[m.Headers().Get(groupcommit.HeaderBatchID)]; f != nil {
				seq, err := strconv.Atoi(m.Headers().Get(groupcommit.HeaderBatchSeq))
				if err != nil {
					return fmt.Errorf("batch %s: message %s: %w", f.ID, m.Subject(), err)
				}
				f.StoredSeqs = append(f.StoredSeqs, seq)
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			for _, f := range byMsgID[id] {
				f.Stored[id]++
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", topology.StreamInbound, err)
	}
	for i := range facts {
		slices.Sort(facts[i].StoredSeqs)
	}
	return facts, nil
}

// checkBatches adds the verdict on the killed batches to r: each stored
// whole (batch sequences 1..n) or not at all, and each of its turns stored
// exactly once.
func checkBatches(f *Facts, r *Report) {
	for _, b := range f.Batches {
		n := len(b.MsgIDs)
		r.BatchSizes = append(r.BatchSizes, n)
		switch {
		case len(b.StoredSeqs) == 0:
			r.BatchesStoredNone++
		case slices.Equal(b.StoredSeqs, seqsTo(n)):
			r.BatchesStoredWhole++
		default:
			r.PartialBatches++
			r.example("atomic batches stored in part", "batch %s of %d turns: stored batch sequences %v", b.ID, n, b.StoredSeqs)
		}
		for _, id := range b.MsgIDs {
			if c := b.Stored[id]; c != 1 {
				r.BatchTurnsNotOnce++
				r.example("turns of a killed batch not stored exactly once", "batch %s: inbound message %s stored %d times", b.ID, id, c)
			}
		}
	}
}

func seqsTo(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i + 1
	}
	return s
}
