package soak_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// soakPolicy: "fast" runs at once; "guarded" needs the requester's approval.
const soakPolicy = `{
  "version": "soak",
  "tools": {"fast": {"approval": "never"}, "guarded": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// sessionTurns is how many consecutive turns of a slot share a session: a
// session then goes idle for good, and its record expires under load.
const sessionTurns = 25

// turnTimeout is how long a slot waits for one turn's outcome before it
// moves on (the turn is still checked at the end).
const turnTimeout = 2 * time.Minute

type params struct {
	Turns         int           `json:"turns"`
	Retention     time.Duration `json:"retention_ns"`
	Concurrency   int           `json:"concurrency"`
	ApprovalEvery int           `json:"approval_every"`
	Sample        time.Duration `json:"sample_ns"`
	out           string
}

func envParams(t *testing.T) params {
	t.Helper()
	num := func(name string, def int) int {
		v, err := strconv.Atoi(os.Getenv(name))
		if err != nil || v <= 0 {
			return def
		}
		return v
	}
	dur := func(name string, def time.Duration) time.Duration {
		v, err := time.ParseDuration(os.Getenv(name))
		if err != nil || v <= 0 {
			return def
		}
		return v
	}
	out := os.Getenv("TOLLGATE_SOAK_OUT")
	if out == "" {
		out = filepath.Join("..", "..", "results", "soak")
	}
	return params{
		Turns: num("TOLLGATE_SOAK_TURNS", 0), Retention: dur("TOLLGATE_SOAK_RETENTION", 20*time.Second),
		Concurrency: num("TOLLGATE_SOAK_CONCURRENCY", 64), ApprovalEvery: num("TOLLGATE_SOAK_APPROVAL_EVERY", 5),
		Sample: dur("TOLLGATE_SOAK_SAMPLE", 2*time.Second), out: out,
	}
}

// TestRetentionSoak drives TOLLGATE_SOAK_TURNS turns through a pipeline
// whose records are kept TOLLGATE_SOAK_RETENTION, samples the bytes of
// every bucket, turn log and stream, writes the curve under results/soak,
// and fails on any safety violation or when the records' bytes (the
// buckets' and the turn logs') do not level off. See
// the package doc.
func TestRetentionSoak(t *testing.T) {
	p := envParams(t)
	if p.Turns == 0 {
		t.Skip("set TOLLGATE_SOAK_TURNS to run the retention soak (make soak-retention)")
	}
	d := &driver{approved: map[string]bool{}, waiting: map[string]chan struct{}{}, outcomes: map[string]*outcomeFact{}}
	d.fast = &countTool{name: "fast", d: d}
	d.guarded = &countTool{name: "guarded", d: d, needsApproval: true}
	h := pt.Start(t, pt.Options{Policy: soakPolicy, Tools: []tools.Tool{d.fast, d.guarded}, Retention: p.Retention})
	d.js = h.JS
	if err := d.subscribe(h.Env.NC); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var samples []sample
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(p.Sample)
		defer tick.Stop()
		for {
			if s, err := take(ctx, h.JS, start, d.done.Load()); err == nil {
				samples = append(samples, s)
			} else {
				t.Logf("sample: %v", err)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	turns := d.drive(ctx, p)
	driven := time.Since(start)
	// Every turn's outcome (the slots moved on from a slow one).
	deadline := time.Now().Add(turnTimeout)
	for d.unfinished() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	pending, err := pendingApprovals(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	// The drain: every record of an ended turn leaves within the retention.
	time.Sleep(p.Retention + 3*p.Sample)
	close(stopSampling)
	<-sampled

	r := d.check(turns, p)
	r.Params, r.DrivenSeconds, r.Samples = p, driven.Seconds(), samples
	r.TurnsPerSecond = float64(len(turns)) / driven.Seconds()
	r.PendingApprovalsAfterDrive = pending
	if pending > 0 {
		r.violate("pending approval left after every turn ended: %d", pending)
	}
	if n, err := dlqMessages(ctx, h.JS); err != nil {
		t.Fatal(err)
	} else if r.DeadLetters = n; n > 0 {
		r.violate("dead letters: %d", n)
	}
	r.plateau(driven, p)
	if err := r.write(p.out); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d turns in %.0fs (%.0f turns/s); record bytes (buckets and turn logs): plateau %s; violations %d", len(turns), driven.Seconds(), r.TurnsPerSecond, r.Plateau, len(r.Violations))
	for _, v := range r.Violations {
		t.Error(v)
	}
	if !r.Plateau.Level {
		t.Errorf("record bytes (buckets and turn logs) did not level off: %s", r.Plateau)
	}
}

// driver sends turns, approves every requested approval, and gathers what
// the safety checks need.
type driver struct {
	js            jetstream.JetStream
	fast, guarded *countTool
	done          atomic.Int64 // turns with an outcome
	sendErrors    atomic.Int64

	mu       sync.Mutex
	approved map[string]bool          // approval ids the decider approved
	waiting  map[string]chan struct{} // turn id -> closed at its first outcome
	outcomes map[string]*outcomeFact
	decide   chan string
}

// outcomeFact is what the outcome messages of one turn said.
type outcomeFact struct {
	state    schemas.TurnState
	statuses string // result statuses, in call order
	repeats  int    // identical outcomes after the first
	conflict bool   // an outcome that disagreed with the first
}

// countTool counts its runs per call id and checks, as each call runs, that
// it runs under its own turn's context and, for a call that needs one,
// after the decider approved it.
type countTool struct {
	name          string
	d             *driver
	needsApproval bool

	mu       sync.Mutex
	runs     map[string]int32
	problems []string
}

func (c *countTool) Name() string { return c.name }

func (c *countTool) Run(_ context.Context, call tools.Call) (string, error) {
	var problem string
	switch {
	case call.Context == nil || !strings.HasPrefix(call.CallID, call.Context.TurnID+"-"):
		problem = fmt.Sprintf("%s ran %s under another turn's context", c.name, call.CallID)
	case c.needsApproval:
		c.d.mu.Lock()
		ok := c.d.approved[schemas.ApprovalID(call.Context.TurnID, 1)]
		c.d.mu.Unlock()
		if !ok {
			problem = fmt.Sprintf("%s ran %s without an approval", c.name, call.CallID)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int32{}
	}
	c.runs[call.CallID]++
	if problem != "" {
		c.problems = append(c.problems, problem)
	}
	return "ok", nil
}

func (c *countTool) runsOf(callID string) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[callID]
}

func (d *driver) subscribe(nc *nats.Conn) error {
	d.decide = make(chan string, 1<<16)
	for range 4 {
		go d.decider()
	}
	// A turn's outcome and its requests are its log's outcome and
	// awaiting events (docs/protocol.md 4.2a): the appends, heard live.
	for subj, fn := range map[string]nats.MsgHandler{
		topology.SubjectTurnLogPrefix + "*.*." + store.EventOutcome:  d.onOutcome,
		topology.SubjectTurnLogPrefix + "*.*." + store.EventAwaiting: d.onRequested,
	} {
		s, err := nc.Subscribe(subj, fn)
		if err != nil {
			return err
		}
		if err := s.SetPendingLimits(-1, -1); err != nil { // never drop an event
			return err
		}
	}
	return nc.Flush()
}

func (d *driver) onOutcome(m *nats.Msg) {
	_, turn, _, _ := topology.ParseTurnLogSubject(m.Subject)
	o, err := store.DecodeOutcome(turn, m.Data)
	if err != nil {
		return // not an outcome of this pipeline's: nothing writes such
	}
	var st []string
	for _, r := range o.Results {
		st = append(st, string(r.Status))
	}
	statuses := strings.Join(st, ",")
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.outcomes[o.TurnID]; f != nil {
		if f.state == o.State && f.statuses == statuses {
			f.repeats++
		} else {
			f.conflict = true
		}
		return
	}
	d.outcomes[o.TurnID] = &outcomeFact{state: o.State, statuses: statuses}
	if ch := d.waiting[o.TurnID]; ch != nil {
		close(ch)
		delete(d.waiting, o.TurnID)
	}
	d.done.Add(1)
}

func (d *driver) onRequested(m *nats.Msg) {
	_, turn, _, _ := topology.ParseTurnLogSubject(m.Subject)
	reqs, _ := store.DecodeRequested(turn, m.Data)
	for _, a := range reqs {
		d.decide <- a.ApprovalID
	}
}

// decider approves each requested approval as its requester.
func (d *driver) decider() {
	for id := range d.decide {
		dec := &schemas.Decision{
			DecisionID: "soak-d-" + id, ApprovalID: id, Transport: "cli",
			Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
			Option:  schemas.OptionApprove, SentAt: time.Now().UTC(),
		}
		d.mu.Lock()
		d.approved[id] = true
		d.mu.Unlock()
		if err := d.publish(topology.DecisionSubject("cli", id), topology.DecisionMsgID(dec.DecisionID), dec); err != nil {
			d.sendErrors.Add(1)
		}
	}
}

// publish publishes r with message id msgID, trying a few times.
func (d *driver) publish(subject, msgID string, r schemas.Record) error {
	data, err := schemas.Encode(r)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = d.js.Publish(ctx, subject, data, jetstream.WithMsgID(msgID))
		cancel()
		if err == nil || attempt == 5 {
			return err
		}
		time.Sleep(time.Second)
	}
}

// sentTurn is one turn the driver sent.
type sentTurn struct {
	id       string
	approval bool
}

// drive runs p.Concurrency slots, each sending one turn at a time and
// waiting for its outcome, until p.Turns turns were sent; it returns them.
func (d *driver) drive(ctx context.Context, p params) []sentTurn {
	var next atomic.Int64
	var mu sync.Mutex
	var sent []sentTurn
	var wg sync.WaitGroup
	for slot := range p.Concurrency {
		wg.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				i := next.Add(1)
				if i > int64(p.Turns) {
					return
				}
				approval := i%int64(p.ApprovalEvery) == 0
				calls := []schemas.ProposedCall{pt.Call("fast", `{}`)}
				if approval {
					calls = append(calls, pt.Call("guarded", `{}`))
				}
				session := fmt.Sprintf("soak-%d-%d", slot, k/sessionTurns)
				m := &schemas.InboundMessage{
					Transport: "cli", MessageID: "soak-m-" + strconv.FormatInt(i, 10), SessionID: session,
					Sender:  schemas.Sender{ID: "alice", Display: "alice", Kind: schemas.SenderUser, Verified: true},
					Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
					Text:    "soak", Calls: calls, SentAt: time.Now().UTC(),
				}
				id := schemas.TurnID("cli", m.MessageID)
				done := make(chan struct{})
				d.mu.Lock()
				d.waiting[id] = done
				d.mu.Unlock()
				mu.Lock()
				sent = append(sent, sentTurn{id: id, approval: approval})
				mu.Unlock()
				if err := d.publish(topology.InboundSubject("cli", session), topology.InboundMsgID("cli", m.MessageID), m); err != nil {
					d.sendErrors.Add(1)
					continue
				}
				select {
				case <-done:
				case <-time.After(turnTimeout):
				case <-ctx.Done():
				}
			}
		})
	}
	wg.Wait()
	return sent
}

func (d *driver) unfinished() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.waiting)
}

// sample is one reading of the bytes the records (KV, and the turn logs,
// which keep the batch records) and the streams hold.
type sample struct {
	Seconds      float64           `json:"t_s"`
	TurnsDone    int64             `json:"turns_done"`
	BucketBytes  map[string]uint64 `json:"bucket_bytes"`
	BucketValues map[string]uint64 `json:"bucket_values"`
	// TurnLogBytes is every turn log's bytes: each turn's batch record,
	// every write of it, kept until the streams' max age (the retention).
	TurnLogBytes uint64            `json:"turn_log_bytes"`
	StreamBytes  map[string]uint64 `json:"stream_bytes"`
}

// recordBytes is the bytes of every record of the turns: the buckets' and
// the turn logs'.
func (s sample) recordBytes() uint64 {
	n := s.TurnLogBytes
	for _, b := range s.BucketBytes {
		n += b
	}
	return n
}

var (
	buckets = []string{topology.BucketApprovals, topology.BucketBatches, topology.BucketSessions, topology.BucketClaims}
	streams = []string{topology.StreamInbound, topology.StreamTurns, topology.StreamDecisions, topology.StreamEvents, topology.StreamDLQ}
)

func take(ctx context.Context, js jetstream.JetStream, start time.Time, done int64) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s := sample{Seconds: time.Since(start).Seconds(), TurnsDone: done,
		BucketBytes: map[string]uint64{}, BucketValues: map[string]uint64{}, StreamBytes: map[string]uint64{}}
	for _, b := range buckets {
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			return s, err
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return s, err
		}
		s.BucketBytes[b], s.BucketValues[b] = st.Bytes(), st.Values()
	}
	for _, name := range streams {
		str, err := js.Stream(ctx, name)
		if err != nil {
			return s, err
		}
		s.StreamBytes[name] = str.CachedInfo().State.Bytes
	}
	logs, err := topology.OpenTurnLogs(ctx, js)
	if err != nil {
		return s, err
	}
	for _, str := range logs {
		s.TurnLogBytes += str.CachedInfo().State.Bytes
	}
	return s, nil
}

// pendingApprovals counts the approvals KV holds as pending.
func pendingApprovals(ctx context.Context, h *pt.H) (int, error) {
	lister, err := h.Store.Approvals.KV.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for key := range lister.Keys() {
		a, _, err := h.Store.Approvals.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return 0, err
		case a.Status == schemas.ApprovalPending:
			n++
		}
	}
	return n, nil
}

func dlqMessages(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.Msgs, nil
}

// report is the soak's result, written as JSON (and the curve as CSV).
type report struct {
	Params                     params   `json:"params"`
	DrivenSeconds              float64  `json:"driven_s"`
	TurnsPerSecond             float64  `json:"turns_per_s"`
	Turns                      int      `json:"turns"`
	ApprovalTurns              int      `json:"approval_turns"`
	RepeatedOutcomes           int      `json:"repeated_outcomes"` // identical outcome messages seen again (not a violation)
	PendingApprovalsAfterDrive int      `json:"pending_approvals_after_drive"`
	DeadLetters                uint64   `json:"dead_letters"`
	Violations                 []string `json:"violations"`
	Plateau                    plateau  `json:"plateau"`
	Samples                    []sample `json:"samples"`
}

func (r *report) violate(format string, args ...any) {
	if len(r.Violations) < 100 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// check applies the safety checks to what the driver saw: every turn
// reached exactly one outcome, completed with every call ok (a call whose
// claim or approval went missing would fail or run again); every call ran
// exactly once, under its own turn's context, an approved call only after
// its approval.
func (d *driver) check(turns []sentTurn, p params) *report {
	r := &report{Turns: len(turns), Violations: []string{}}
	if n := d.sendErrors.Load(); n > 0 {
		r.violate("publishes that failed: %d", n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range turns {
		want := "ok"
		if t.approval {
			r.ApprovalTurns++
			want = "ok,ok"
		}
		o := d.outcomes[t.id]
		switch {
		case o == nil:
			r.violate("turn %s: no outcome", t.id)
			continue
		case o.conflict:
			r.violate("turn %s: conflicting outcomes", t.id)
		case o.state != schemas.TurnCompleted || o.statuses != want:
			r.violate("turn %s: outcome %s with results %q, want completed with %q", t.id, o.state, o.statuses, want)
		}
		r.RepeatedOutcomes += o.repeats
		if n := d.fast.runsOf(schemas.CallID(t.id, 0)); n != 1 {
			r.violate("call %s ran %d times", schemas.CallID(t.id, 0), n)
		}
		if n := d.guarded.runsOf(schemas.CallID(t.id, 1)); t.approval && n != 1 || !t.approval && n != 0 {
			r.violate("call %s ran %d times", schemas.CallID(t.id, 1), n)
		}
	}
	for _, c := range []*countTool{d.fast, d.guarded} {
		c.mu.Lock()
		for _, pr := range c.problems {
			r.violate("%s", pr)
		}
		c.mu.Unlock()
	}
	return r
}

// plateau says whether the records' bytes (the buckets' and the turn
// logs', sample.recordBytes) levelled off while turns kept ending. Over the steady part of the drive (from twice the retention on,
// when the first records have had time to expire), split in two halves,
// the bytes per live turn (turns that ended within the last retention,
// whose records are still kept) of the second half are at most 25% above
// the first's: records that never left would make it grow with every turn
// ended, while a load that merely changes (the machine is shared) moves
// bytes and live turns together. And once the drive has stopped and the
// retention has run out, at most 5% of the highest reading is left
// (Drained).
type plateau struct {
	Level                 bool    `json:"level"`
	FirstHalfMax          uint64  `json:"first_half_max_bytes"`
	SecondHalfMax         uint64  `json:"second_half_max_bytes"`
	FirstHalfPerLiveTurn  float64 `json:"first_half_bytes_per_live_turn"`
	SecondHalfPerLiveTurn float64 `json:"second_half_bytes_per_live_turn"`
	Growth                float64 `json:"growth"` // second half's bytes per live turn over the first's
	Drained               uint64  `json:"drained_bytes"`
	Reason                string  `json:"reason,omitempty"`
}

func (p plateau) String() string {
	if p.Reason != "" {
		return p.Reason
	}
	return fmt.Sprintf("max %d B then %d B; %.0f then %.0f B per live turn (growth %.2f); %d B left after the drain",
		p.FirstHalfMax, p.SecondHalfMax, p.FirstHalfPerLiveTurn, p.SecondHalfPerLiveTurn, p.Growth, p.Drained)
}

func (r *report) plateau(driven time.Duration, p params) {
	var steady []sample
	var live []int64 // of each steady sample
	for i, s := range r.Samples {
		if s.Seconds < (2*p.Retention).Seconds() || s.Seconds > driven.Seconds() {
			continue
		}
		j := i
		for j > 0 && r.Samples[j].Seconds > s.Seconds-p.Retention.Seconds() {
			j--
		}
		steady, live = append(steady, s), append(live, s.TurnsDone-r.Samples[j].TurnsDone)
	}
	if len(steady) < 10 {
		r.Plateau.Reason = fmt.Sprintf("only %d samples in the steady part of the drive: drive longer than twice the retention", len(steady))
		return
	}
	half := len(steady) / 2
	// maxAndPerLive is the highest reading of ss and their bytes per live turn.
	maxAndPerLive := func(ss []sample, ls []int64) (uint64, float64) {
		var m, bytes uint64
		var turns int64
		for i, s := range ss {
			m, bytes, turns = max(m, s.recordBytes()), bytes+s.recordBytes(), turns+ls[i]
		}
		return m, float64(bytes) / float64(max(turns, 1))
	}
	pl := &r.Plateau
	pl.FirstHalfMax, pl.FirstHalfPerLiveTurn = maxAndPerLive(steady[:half], live[:half])
	pl.SecondHalfMax, pl.SecondHalfPerLiveTurn = maxAndPerLive(steady[half:], live[half:])
	pl.Growth = pl.SecondHalfPerLiveTurn / max(pl.FirstHalfPerLiveTurn, 1)
	pl.Drained = r.Samples[len(r.Samples)-1].recordBytes()
	pl.Level = pl.Growth <= 1.25 && float64(pl.Drained) <= 0.05*float64(max(pl.FirstHalfMax, pl.SecondHalfMax))
}

func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	var csv strings.Builder
	csv.WriteString("t_s,turns_done," + strings.Join(buckets, ",") + ",turn_logs,records_total," + strings.Join(streams, ",") + "\n")
	for _, s := range r.Samples {
		row := []string{strconv.FormatFloat(s.Seconds, 'f', 1, 64), strconv.FormatInt(s.TurnsDone, 10)}
		for _, b := range buckets {
			row = append(row, strconv.FormatUint(s.BucketBytes[b], 10))
		}
		row = append(row, strconv.FormatUint(s.TurnLogBytes, 10), strconv.FormatUint(s.recordBytes(), 10))
		for _, st := range streams {
			row = append(row, strconv.FormatUint(s.StreamBytes[st], 10))
		}
		csv.WriteString(strings.Join(row, ",") + "\n")
	}
	for name, body := range map[string][]byte{"retention-" + stamp + ".json": data, "retention-" + stamp + ".csv": []byte(csv.String())} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return err
		}
		latest := "latest" + filepath.Ext(name)
		if err := os.WriteFile(filepath.Join(dir, latest), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}
