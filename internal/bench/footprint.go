package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// footprint is what the footprint phase measured.
type footprint struct {
	Pending     int     `json:"pending"`
	PopulateSec float64 `json:"populate_seconds"`
	// Resident memory (bytes) of each stage process: at start (idle), with
	// Pending approvals pending (after the stages settled), and the peak.
	RSSIdle    map[string]int64 `json:"rss_idle"`
	RSSPending map[string]int64 `json:"rss_pending"`
	RSSPeak    map[string]int64 `json:"rss_peak"`
	// BenchRSS is this process (embedded nats-server and driver) with
	// Pending approvals pending.
	BenchRSS int64 `json:"bench_process_rss"`
	// KV: the approvals bucket's stream bytes and messages, and the bytes
	// of every record of the turns (the four buckets' and the turn logs',
	// which keep the batch records), with Pending approvals pending.
	ApprovalBytes uint64  `json:"approvals_bucket_bytes"`
	ApprovalMsgs  uint64  `json:"approvals_bucket_msgs"`
	AllKVBytes    uint64  `json:"all_kv_bytes"`
	DecideSec     float64 `json:"decide_seconds"`     // all decisions applied by the approver
	RecoverySec   float64 `json:"recovery_seconds"`   // redriver restart -> last outcome
	RedriverRSS   int64   `json:"redriver_rss_after"` // after recovery
	RedriverPeak  int64   `json:"redriver_rss_peak"`  // during recovery
	Outcomes      int64   `json:"outcomes"`           // outcomes seen after the restart
}

// footprintRun leaves Pending approvals pending with the stages as
// separate processes (each turn one write_file call in its own session, so
// none queues behind another), measures each worker's resident memory and
// the KV bytes, then stops the redriver, approves every request (the
// approver applies them; the decided events wait in the stream), restarts
// the redriver and times until every batch has its outcome.
func (b *bencher) footprintRun() (footprint, error) {
	fp := footprint{Pending: b.cfg.Pending, RSSIdle: map[string]int64{}, RSSPending: map[string]int64{}, RSSPeak: map[string]int64{}}
	e, err := b.startEnv(single)
	if err != nil {
		return fp, err
	}
	defer e.close()
	ps, err := startProcs(e, b.cfg.BinDir, b.cfg.LogLevel)
	if err != nil {
		return fp, err
	}
	defer ps.stop()
	for s, p := range ps.procs {
		fp.RSSIdle[s], _, _ = rss(p.cmd.Process.Pid)
	}
	nc, js, err := e.connect("bench-footprint")
	if err != nil {
		return fp, err
	}
	defer nc.Close()
	d, err := newDriver(nc, js, b.runID(), pendingPath, false, false, false)
	if err != nil {
		return fp, err
	}
	defer d.close()

	n := b.cfg.Pending
	budget := time.Duration(n)*20*time.Millisecond + 2*time.Minute
	t0 := time.Now()
	turns := make([]string, 0, n)
	for i := range n {
		t, err := d.send(fmt.Sprintf("%s-fp-%d", d.run, i))
		if err != nil {
			return fp, err
		}
		turns = append(turns, t.id)
	}
	if err := waitFor(budget, fmt.Sprintf("%d approvals requested", n), func() bool { return d.requested.Load() >= int64(n) }); err != nil {
		return fp, fmt.Errorf("%w (%d requested)", err, d.requested.Load())
	}
	fp.PopulateSec = time.Since(t0).Seconds()
	// Let the executor finish its awaiting writes (each after its approval's
	// requested event) and every stage go idle.
	for _, s := range stageNames {
		if err := waitIdle(js, stageConsumer[s].Stream, stageConsumer[s].Config.Durable, budget); err != nil {
			return fp, err
		}
	}
	time.Sleep(2 * time.Second)
	for s, p := range ps.procs {
		cur, peak, err := rss(p.cmd.Process.Pid)
		if err != nil {
			return fp, err
		}
		fp.RSSPending[s], fp.RSSPeak[s] = cur, peak
	}
	fp.BenchRSS, _, _ = rss(os.Getpid())
	ctx := context.Background()
	for _, bucket := range []string{topology.BucketApprovals, topology.BucketBatches, topology.BucketSessions, topology.BucketClaims} {
		s, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			return fp, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return fp, err
		}
		fp.AllKVBytes += info.State.Bytes
		if bucket == topology.BucketApprovals {
			fp.ApprovalBytes, fp.ApprovalMsgs = info.State.Bytes, info.State.Msgs
		}
	}
	// The batch records: each turn's log, every event of it (a pending
	// turn's queued, running and awaiting writes).
	logs, err := topology.OpenTurnLogs(ctx, js)
	if err != nil {
		return fp, err
	}
	for _, s := range logs {
		info, err := s.Info(ctx)
		if err != nil {
			return fp, err
		}
		fp.AllKVBytes += info.State.Bytes
	}

	// Decided but not redriven: stop the redriver, decide everything.
	ps.stopOne("redriver")
	t0 = time.Now()
	var sent sync.WaitGroup
	slots := make(chan struct{}, 64) // decisions in flight, as 64 people deciding at once
	for _, id := range turns {
		slots <- struct{}{}
		sent.Go(func() {
			defer func() { <-slots }()
			d.sendDecision(schemas.ApprovalID(id, pendingPath.approvalIndex()))
		})
	}
	sent.Wait()
	// Each decision is its approval record's revision (no event is
	// published for it): wait until every record is decided.
	approvals, err := js.KeyValue(context.Background(), topology.BucketApprovals)
	if err != nil {
		return fp, err
	}
	undecided := slices.Clone(turns)
	if err := waitFor(budget, fmt.Sprintf("%d decided approvals", n), func() bool {
		undecided = slices.DeleteFunc(undecided, func(id string) bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			e, err := approvals.Get(ctx, schemas.ApprovalID(id, pendingPath.approvalIndex()))
			if err != nil {
				return false
			}
			a, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
			return err == nil && a.Status.Decided()
		})
		return len(undecided) == 0
	}); err != nil {
		return fp, err
	}
	fp.DecideSec = time.Since(t0).Seconds()

	d.outcomes.Store(0)
	t0 = time.Now()
	if err := ps.start("redriver"); err != nil {
		return fp, err
	}
	pid := ps.procs["redriver"].cmd.Process.Pid
	var peak int64
	err = waitFor(budget, fmt.Sprintf("%d outcomes after the redriver restart", n), func() bool {
		if _, pk, err := rss(pid); err == nil {
			peak = max(peak, pk)
		}
		return d.outcomes.Load() >= int64(n)
	})
	fp.RecoverySec = time.Since(t0).Seconds()
	fp.Outcomes = d.outcomes.Load()
	if err != nil {
		return fp, err
	}
	fp.RedriverRSS, fp.RedriverPeak, _ = rss(pid)
	fp.RedriverPeak = max(fp.RedriverPeak, peak)
	return fp, nil
}

// waitIdle waits until the consumer has nothing pending or unacknowledged.
func waitIdle(js jetstream.JetStream, stream, consumer string, timeout time.Duration) error {
	// Idle is seen twice in a row, 20 ms apart: the server acknowledges a
	// publish before it tells the stream's consumers, so right after a
	// publish one read of the consumer's info can still say nothing is
	// pending. (A wait on the ack floor reaching the last matching message
	// would be exact, but its stream reads would show in the trace.)
	seen := 0
	return waitFor(timeout, consumer+" idle", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := consumerInfo(ctx, js, stream, consumer)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			if seen++; seen == 2 {
				return true
			}
		} else {
			seen = 0
		}
		time.Sleep(20 * time.Millisecond)
		return false
	})
}

var _ = nats.Connect
