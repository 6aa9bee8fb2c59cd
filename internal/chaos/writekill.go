package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The write kill fault (Config.WriteKills): a stage is SIGKILLed right
// after it made the k-th durable write of a turn, for every k of both
// paths in turn: the plain path (calls that run at once: accepted turn,
// batch created running, the outcome that completes it) and the approval
// path (kind "single": accepted turn, batch running, approval created,
// batch awaiting with its request, approval decided (the record's
// revision is the decided event), batch started, the outcome with the
// call's result). Every turn of a path makes at least these (a plain turn
// of several calls, or one that waits behind its session's earlier turn,
// makes more), so each position fires. The harness's own writes (the
// inbound message, the decision) are not counted. A turn writes nothing
// to its session: its entry in the session's order is the accepted turn,
// and the end of the batch before it is what lets it run (a kill after
// that terminal write covers a wake cut short).
//
// The harness watches the target turn's writes as they are published (a
// core NATS subscription on each subject the turn's writes go to, one
// channel, so in the order the server sent them) and names the stage that
// made each from what it is: ingest publishes the accepted turn, the
// executor writes until the batch moves to started and the redriver from
// then on, the approver applies decisions (the approval's update and its
// decided event). On the k-th it SIGKILLs every process of that stage
// (the one that made the write is among them), which the supervisors
// restart after the fault's downtime. The stage's next step, be it its
// next write or the acknowledgement of the message it was handling, is cut
// off, unless it was quicker than the kill (the kill lands within a
// fraction of a millisecond; two writes of one stage are a round trip to
// the server apart). The usual checks then show whether a turn was lost,
// ended twice, ran a call twice or out of session order.
//
// A core subscriber also sees a publish the stream refused (a stale
// compare-and-set, a duplicate message id): such a write is counted too,
// so under contention k counts write attempts. That only moves where a
// kill lands; it is reported as it was.

// Write kill paths: the turn kinds whose turns a write kill targets, and
// how many stage writes a turn of each makes (of one call, the last
// approved: the positions a kill is planned after).
const (
	writeKillPlain  = "plain"
	writeKillSingle = "single"
)

var writeKillWrites = map[string]int{writeKillPlain: 3, writeKillSingle: 7}

// WriteKillPlan is one planned write kill: the stage that makes the
// turn's K-th write is killed right after it, for Down.
type WriteKillPlan struct {
	Turn int    // the target turn's index
	Path string // writeKillPlain or writeKillSingle
	K    int
	Down time.Duration
}

func (w WriteKillPlan) String() string {
	return fmt.Sprintf("kill the stage after write %d of %s turn %d, for %v", w.K, w.Path, w.Turn, w.Down.Round(time.Millisecond))
}

// WriteKill is what a write kill did.
type WriteKill struct {
	WriteKillPlan
	TurnID string
	Fired  bool   // the turn made its K-th write and the stage was killed
	Write  string // what the K-th write was ("turnlog running", "approval created", ...)
	Stage  string // the stage killed
	Killed int    // its processes killed
}

// planWriteKills adds c.WriteKills write kills, going round the positions
// of both paths (plain 1..3, then single 1..7, from a seed-drawn start),
// each on a turn of that path drawn from its share of the fault window. It
// draws from a random source of its own, so the turn mix and the other
// faults of a seed are those it had before them.
func planWriteKills(c Config, p *Plan, from, to int) {
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x3a_17_e0_c1))
	var positions []WriteKillPlan
	for _, path := range []string{writeKillPlain, writeKillSingle} {
		for k := 1; k <= writeKillWrites[path]; k++ {
			positions = append(positions, WriteKillPlan{Path: path, K: k})
		}
	}
	// A session whose turns make a grant: its later calls of the granted
	// tool are decided by the grant, with other writes than the path's.
	granted := map[int]bool{}
	for _, t := range p.Turns {
		if slices.ContainsFunc(t.Calls, func(c CallPlan) bool { return c.Decision == DecideGrant }) {
			granted[t.Session] = true
		}
	}
	first, used := rng.IntN(len(positions)), map[int]bool{}
	for i := range c.WriteKills {
		w := positions[(first+i)%len(positions)]
		span := max((to-from)/c.WriteKills, 1)
		start := from + span*i + rng.IntN(span)
		w.Turn = -1
		for j := range len(p.Turns) {
			t := p.Turns[(start+j)%len(p.Turns)]
			if t.Kind == w.Path && !used[t.Index] && !granted[t.Session] && !t.Revoke {
				w.Turn = t.Index
				break
			}
		}
		if w.Turn < 0 {
			continue // no turn of the path left
		}
		used[w.Turn] = true
		w.Down = 50*time.Millisecond + jitter(rng, 1500*time.Millisecond)
		p.WriteKills = append(p.WriteKills, w)
	}
}

// writeWatch follows one target turn's writes.
type writeWatch struct {
	h     *harness
	plan  WriteKillPlan
	turn  *turnState
	sess  string // session key
	subs  []*nats.Subscription
	msgs  chan *nats.Msg
	phase string // the stage that moves the batch now: executor, then redriver
	n     int    // stage writes seen
	out   *WriteKill
}

// armWriteKills subscribes to the writes of every planned write kill's
// turn before the drive starts, and kills as they come; the returned stop
// ends the watches and returns what each did.
func (h *harness) armWriteKills(ctx context.Context, nc *nats.Conn, d *driver) (stop func() []WriteKill, err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var watches []*writeWatch
	stop = func() []WriteKill {
		cancel()
		wg.Wait()
		out := make([]WriteKill, 0, len(watches))
		for _, w := range watches {
			for _, s := range w.subs {
				_ = s.Unsubscribe()
			}
			out = append(out, *w.out)
		}
		return out
	}
	for _, p := range h.plan.WriteKills {
		t := d.turns[p.Turn]
		w := &writeWatch{h: h, plan: p, turn: t, sess: schemas.SessionKey(transport, t.sessionID), msgs: make(chan *nats.Msg, 256),
			phase: "executor", out: &WriteKill{WriteKillPlan: p, TurnID: t.id}}
		watches = append(watches, w)
		subjects := []string{
			topology.OrderWildcard(w.sess),
			"tollgate.event.*.*." + t.id,
			topology.SubjectTurnLogPrefix + "*." + t.id + ".>",
		}
		for i := range t.plan.Calls {
			subjects = append(subjects, "$KV."+topology.BucketApprovals+"."+schemas.ApprovalID(t.id, i))
		}
		for _, s := range subjects {
			sub, serr := nc.ChanSubscribe(s, w.msgs)
			if serr != nil {
				stop()
				return nil, fmt.Errorf("write kill of %s: subscribe %s: %w", t.id, s, serr)
			}
			w.subs = append(w.subs, sub)
		}
		wg.Go(func() { w.run(ctx) })
	}
	if err := nc.Flush(); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// run counts the turn's stage writes and kills at the K-th.
func (w *writeWatch) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-w.msgs:
			stage, what := w.writer(m)
			if stage == "" {
				continue
			}
			w.n++
			if w.n == w.plan.K {
				w.kill(stage, what)
				for _, s := range w.subs {
					_ = s.Unsubscribe() // nothing more to count
				}
				return
			}
		}
	}
}

// writer names the stage that made write m of the turn, and the write;
// "" for a message that is not one of the turn's stage writes.
func (w *writeWatch) writer(m *nats.Msg) (stage, what string) {
	turn := w.turn.id
	switch {
	case strings.HasPrefix(m.Subject, topology.SubjectTurnOrder):
		// The turn's entry in its session's order: ingest accepted it.
		if e, err := turnorder.Stamp(m.Subject, m.Header); err != nil || e.Turn != turn {
			return "", ""
		}
		return "ingest", "accepted turn"
	case strings.HasPrefix(m.Subject, topology.SubjectTurnLogPrefix):
		_, _, state, ok := topology.ParseTurnLogSubject(m.Subject)
		if !ok {
			return "", ""
		}
		switch {
		case schemas.BatchState(state) == schemas.BatchStarted:
			w.phase = "redriver"
		case store.Terminal(state): // the outcome event
		default:
			return "executor", "turnlog " + state
		}
		return w.phase, "turnlog " + state
	case strings.HasPrefix(m.Subject, "$KV."+topology.BucketApprovals+"."):
		if a, err := schemas.Decode[schemas.ApprovalRecord](m.Data); err == nil && a.Status == schemas.ApprovalPending && len(a.Votes) == 0 {
			return "executor", "approval created"
		}
		return "approver", "approval decided"
	case strings.HasPrefix(m.Subject, topology.SubjectApprovalRequested):
		return "executor", "approval.requested"
	case strings.HasPrefix(m.Subject, topology.SubjectApprovalDecided), strings.HasPrefix(m.Subject, topology.SubjectApprovalVoted):
		return "approver", strings.Join(strings.Split(m.Subject, ".")[2:4], ".")
	case strings.HasPrefix(m.Subject, topology.SubjectTurnOutcome):
		return w.phase, "turn.outcome"
	case strings.HasPrefix(m.Subject, topology.SubjectRedrive):
		return "redriver", strings.Join(strings.Split(m.Subject, ".")[2:4], ".")
	}
	return "", ""
}

// kill SIGKILLs every process of stage, each restarted after the plan's
// downtime.
func (w *writeWatch) kill(stage, what string) {
	h := w.h
	w.out.Fired, w.out.Write, w.out.Stage = true, what, stage
	for _, s := range h.stages[stage] {
		if err := s.killNow(w.plan.Down); err == nil {
			w.out.Killed++
		}
	}
	h.countKills(stage, w.out.Killed)
	h.logf("write kill: %s (%s) after write %d (%s) of %s turn %s: %d processes", stage, w.plan.Down.Round(time.Millisecond), w.plan.K, what, w.plan.Path, w.turn.id, w.out.Killed)
}

// writeKillPositions is how many positions the write kills go round:
// every write of both paths (the long form plans one kill at each).
func writeKillPositions() int {
	return writeKillWrites[writeKillPlain] + writeKillWrites[writeKillSingle]
}
