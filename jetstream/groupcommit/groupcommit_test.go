package groupcommit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// These tests run against a real embedded nats-server with Tollgate's
// topology (every stream and bucket allows atomic publish). The batch
// tests build a batch directly (stream.batch, what a commit of gathered
// writes calls), so that which writes share it is not left to timing.

func newCommitter(t *testing.T, env *jstest.Env, extra ...jetstream.StreamConfig) (*Committer, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	streams := append(append(env.Topology.Streams(), env.Topology.BucketStreams()...), extra...)
	c, err := New(env.JS, Config{Streams: streams, MinBatch: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c, &logs
}

func kvMsg(bucket, key, data string, rev uint64) *nats.Msg {
	m := nats.NewMsg("$KV." + bucket + "." + key)
	m.Data = []byte(data)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	return m
}

func eventMsg(subject, msgID string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte("event " + msgID)
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	return m
}

// commitBatch commits ms as one gathered batch on their stream and returns
// each write's answer, in order.
func commitBatch(t *testing.T, c *Committer, ms ...*nats.Msg) []result {
	t.Helper()
	s := c.streamOf(ms[0].Subject)
	ws := make([]*write, len(ms))
	for i, m := range ms {
		if c.streamOf(m.Subject) != s {
			t.Fatalf("%s is not on %s", m.Subject, s.name)
		}
		ws[i] = &write{m: m, done: make(chan result, 1)}
	}
	s.commit(context.Background(), nil, ws)
	out := make([]result, len(ws))
	for i, w := range ws {
		select {
		case out[i] = <-w.done:
		default:
			t.Fatalf("write %d (%s) got no answer", i, w.m.Subject)
		}
	}
	return out
}

func counts(c *Committer, stream string) (batches, batched, refused int64) {
	st := c.Stats(stream)
	return st.Batches, st.BatchedWrites, st.Refused
}

func TestBatchCommitsAllWritesWithTheirOwnRevisions(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	ctx := jstest.Ctx(t)
	b := topology.BucketClaims
	if _, err := env.Buckets.Claims.Create(ctx, "old", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	e, _ := env.Buckets.Claims.Get(ctx, "old")
	res := commitBatch(t, c, kvMsg(b, "a", "A", 0), kvMsg(b, "old", "v2", e.Revision()), kvMsg(b, "c", "C", 0))
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("write %d: %v", i, r.err)
		}
	}
	if n, w, _ := counts(c, "KV_"+b); n != 1 || w != 3 {
		t.Fatalf("%v batches of %v writes, want 1 of 3", n, w)
	}
	for i, key := range []string{"a", "old", "c"} {
		got, err := env.Buckets.Claims.Get(ctx, key)
		if err != nil || got.Revision() != res[i].ack.Sequence {
			t.Fatalf("%s: %v at %v, want the write's own revision %d", key, err, got, res[i].ack.Sequence)
		}
	}
	if res[1].ack.Sequence != res[0].ack.Sequence+1 || res[2].ack.Sequence != res[0].ack.Sequence+2 {
		t.Fatalf("sequences %d %d %d, want consecutive", res[0].ack.Sequence, res[1].ack.Sequence, res[2].ack.Sequence)
	}
}

// A create of a key that exists and an update at a stale revision, each
// among good writes: the batch is refused, the good writes are stored once
// each, and the bad ones get the error they get alone.
func TestRefusedBatchGivesEachWriteItsOwnAnswer(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	ctx := jstest.Ctx(t)
	b := topology.BucketBatches
	rev, err := env.Buckets.Batches.Create(ctx, "taken", []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Buckets.Batches.Update(ctx, "taken", []byte("second"), rev); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		bad  *nats.Msg
	}{
		{"create of an existing key", kvMsg(b, "taken", "dup", 0)},
		{"update at a stale revision", kvMsg(b, "taken", "stale", rev)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.streamOf("$KV." + b + ".x").skip = 0 // no backoff from the subtest before
			_, _, refused0 := counts(c, "KV_"+b)
			p := strings.ReplaceAll(tc.name, " ", "-")
			res := commitBatch(t, c, kvMsg(b, p+"-1", "g1", 0), tc.bad, kvMsg(b, p+"-2", "g2", 0))
			var api *jetstream.APIError
			if !errors.As(res[1].err, &api) || (api.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence && api.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				t.Fatalf("bad write: %v, want a wrong-last-sequence error", res[1].err)
			}
			if !errors.Is(res[1].err, jetstream.ErrKeyExists) {
				t.Fatalf("bad write: %v, want it to read as ErrKeyExists as a single KV write does", res[1].err)
			}
			for _, i := range []int{0, 2} {
				if res[i].err != nil {
					t.Fatalf("good write %d: %v", i, res[i].err)
				}
				e, err := env.Buckets.Batches.Get(ctx, fmt.Sprintf("%s-%d", p, i/2+1))
				if err != nil || e.Revision() != res[i].ack.Sequence {
					t.Fatalf("good write %d: %v, %v", i, e, err)
				}
			}
			if _, _, refused := counts(c, "KV_"+b); refused != refused0+1 {
				t.Fatalf("refused batches %v, want %v", refused, refused0+1)
			}
			if e, _ := env.Buckets.Batches.Get(ctx, "taken"); string(e.Value()) != "second" {
				t.Fatalf("taken holds %q", e.Value())
			}
		})
	}
}

// A message id already stored, among new ones: the batch is refused, the
// new events are stored, and the duplicate is acknowledged as one, as alone.
func TestDuplicateMessageIDInABatch(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	ctx := jstest.Ctx(t)
	subj := func(id string) string { return topology.EventSubject(topology.SubjectTurnOutcome, id) }
	if _, err := env.JS.PublishMsg(ctx, eventMsg(subj("t0"), "m0")); err != nil {
		t.Fatal(err)
	}
	res := commitBatch(t, c, eventMsg(subj("t1"), "m1"), eventMsg(subj("t0b"), "m0"), eventMsg(subj("t2"), "m2"))
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("write %d: %v", i, r.err)
		}
	}
	if !res[1].ack.Duplicate || res[0].ack.Duplicate || res[2].ack.Duplicate {
		t.Fatalf("duplicate flags %v %v %v, want only the second", res[0].ack.Duplicate, res[1].ack.Duplicate, res[2].ack.Duplicate)
	}
	s, _ := env.JS.Stream(ctx, topology.StreamEvents)
	if info, _ := s.Info(ctx); info.State.Msgs != 3 {
		t.Fatalf("events stream holds %d messages, want 3 (m0, m1, m2)", info.State.Msgs)
	}
	if _, _, refused := counts(c, topology.StreamEvents); refused != 1 {
		t.Fatalf("refused %v, want 1", refused)
	}
}

// A message over the stream's size limit, among good ones: the good ones
// are stored, the big one gets the size refusal it gets alone.
func TestTooLargeMessageInABatch(t *testing.T) {
	env := jstest.Start(t)
	small := jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, Storage: jetstream.FileStorage, MaxMsgSize: 512, AllowAtomicPublish: true}
	if _, err := env.JS.CreateStream(jstest.Ctx(t), small); err != nil {
		t.Fatal(err)
	}
	c, _ := newCommitter(t, env, small)
	big := nats.NewMsg("small.big")
	big.Data = bytes.Repeat([]byte("x"), 1024)
	res := commitBatch(t, c, nats.NewMsg("small.a"), big, nats.NewMsg("small.b"))
	if res[0].err != nil || res[2].err != nil {
		t.Fatalf("good writes: %v, %v", res[0].err, res[2].err)
	}
	var api *jetstream.APIError
	if !errors.As(res[1].err, &api) || api.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		t.Fatalf("big write: %v, want message exceeds maximum", res[1].err)
	}
}

// Nats-TTL inside a batch is the message's own.
func TestTTLKeptInsideABatch(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	ctx := jstest.Ctx(t)
	b := topology.BucketSessions
	ttl := kvMsg(b, "ended", "x", 0)
	ttl.Header.Set(jetstream.MsgTTLHeader, "1h")
	res := commitBatch(t, c, kvMsg(b, "live", "y", 0), ttl)
	if res[0].err != nil || res[1].err != nil {
		t.Fatal(res[0].err, res[1].err)
	}
	s, _ := env.JS.Stream(ctx, "KV_"+b)
	for key, want := range map[string]string{"ended": "1h", "live": ""} {
		m, err := s.GetLastMsgForSubject(ctx, "$KV."+b+"."+key)
		if err != nil || m.Header.Get(jetstream.MsgTTLHeader) != want {
			t.Fatalf("%s: %v, TTL %q, want %q", key, err, m.Header.Get(jetstream.MsgTTLHeader), want)
		}
	}
	if n, _, _ := counts(c, "KV_"+b); n != 1 {
		t.Fatalf("%v batches, want 1", n)
	}
}

// Two writes of one key waiting together go in two commits, in order: the
// first create wins, the second gets its own conflict.
func TestSameKeyKeepsOrderAcrossCommits(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	b := topology.BucketClaims
	s := c.streamOf("$KV." + b + ".k")
	first, other, second := kvMsg(b, "k", "first", 0), kvMsg(b, "other", "o", 0), kvMsg(b, "k", "second", 0)
	var ws []*write
	for _, m := range []*nats.Msg{first, other, second} {
		ws = append(ws, &write{m: m, done: make(chan result, 1)})
	}
	s.queue, s.busy = ws, true
	commits := 0
	for more := true; more; commits++ {
		more = s.commitNext(context.Background(), nil)
	}
	if commits != 2 {
		t.Fatalf("%d commits, want 2 (the second write of k waits for the next)", commits)
	}
	r0, r1, r2 := <-ws[0].done, <-ws[1].done, <-ws[2].done
	if r0.err != nil || r1.err != nil || !errors.Is(r2.err, jetstream.ErrKeyExists) {
		t.Fatalf("answers %v, %v, %v; want ok, ok, key exists", r0.err, r1.err, r2.err)
	}
	if e, _ := env.Buckets.Claims.Get(jstest.Ctx(t), "k"); string(e.Value()) != "first" {
		t.Fatalf("k holds %q, want first", e.Value())
	}
}

// A stream that does not allow atomic publish gets single writes, and
// the log says so once.
func TestStreamWithoutAtomicPublishFallsBackToSingles(t *testing.T) {
	env := jstest.Start(t)
	plain := jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"plain.>"}, Storage: jetstream.FileStorage}
	if _, err := env.JS.CreateStream(jstest.Ctx(t), plain); err != nil {
		t.Fatal(err)
	}
	c, logs := newCommitter(t, env, plain)
	for range 2 {
		for i, r := range commitBatch(t, c, nats.NewMsg("plain.a"), nats.NewMsg("plain.b"), nats.NewMsg("plain.c")) {
			if r.err != nil {
				t.Fatalf("write %d: %v", i, r.err)
			}
		}
	}
	if n, _, refused := counts(c, "PLAIN"); n != 0 || refused != 0 {
		t.Fatalf("%v batches, %v refused; want singles only", n, refused)
	}
	if got := strings.Count(logs.String(), "does not allow atomic publish"); got != 1 {
		t.Fatalf("fallback logged %d times, want once:\n%s", got, logs)
	}
}

func TestAtLeast(t *testing.T) {
	for v, want := range map[string]bool{"2.12.0": true, "2.15.2": true, "v2.12.1-RC.1": true, "2.11.9": false, "3.0.0": true, "1.99.0": false, "": false, "2": false} {
		if got := AtLeast(v, 2, 12); got != want {
			t.Errorf("AtLeast(%q, 2, 12) = %v, want %v", v, got, want)
		}
	}
}

// Many writers at once through the committer's JetStream, on a server
// that fsyncs every write: every write is answered and stored once, and
// writes that waited together went in atomic batches.
func TestConcurrentWritersShareBatches(t *testing.T) {
	env := jstest.StartWith(t, jstest.Options{SyncAlways: true})
	c, _ := newCommitter(t, env)
	c.cfg.MinBatch = DefaultMinBatch
	js := c.JetStream()
	ctx := jstest.Ctx(t)
	const writers, each = 64, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rev uint64
			for i := range each {
				// A chain per writer: each update at the revision the
				// previous write returned, plus an event.
				ack, err := js.PublishMsg(ctx, kvMsg(topology.BucketBatches, fmt.Sprintf("w%d", w), strconv.Itoa(i), rev))
				if err != nil {
					errs <- err
					return
				}
				rev = ack.Sequence
				if _, err := js.PublishMsg(ctx, eventMsg(topology.EventSubject(topology.SubjectTurnOutcome, fmt.Sprintf("w%d-%d", w, i)), fmt.Sprintf("w%d-%d", w, i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := range writers {
		e, err := env.Buckets.Batches.Get(ctx, fmt.Sprintf("w%d", w))
		if err != nil || string(e.Value()) != strconv.Itoa(each-1) {
			t.Fatalf("w%d: %v, %v", w, e, err)
		}
	}
	s, _ := env.JS.Stream(ctx, topology.StreamEvents)
	if info, _ := s.Info(ctx); info.State.Msgs != writers*each {
		t.Fatalf("events: %d messages, want %d", info.State.Msgs, writers*each)
	}
	n1, _, _ := counts(c, "KV_"+topology.BucketBatches)
	n2, _, _ := counts(c, topology.StreamEvents)
	if n1+n2 == 0 {
		t.Fatal("no atomic batch: the waiting writes were not gathered")
	}
	t.Logf("batches: %v on the bucket, %v on events", n1, n2)
}

// A lone write with no commit in flight is a plain publish with the
// writer's own context.
func TestLoneWriteIsAPlainPublish(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	ctx, cancel := context.WithTimeout(jstest.Ctx(t), 10*time.Second)
	defer cancel()
	if _, err := c.PublishMsg(ctx, eventMsg(topology.EventSubject(topology.SubjectTurnOutcome, "t1"), "m1")); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := counts(c, topology.StreamEvents); n != 0 || c.Stats(topology.StreamEvents).SingleWrites != 1 {
		t.Fatalf("%v batches, want one single write", n)
	}
}

// The broker stops while a large atomic batch is being committed: after
// it restarts, the batch's writes are all stored or none is, never some;
// and writers that were acknowledged find their writes.
func TestBrokerStopDuringALargeBatchIsAllOrNothing(t *testing.T) {
	env := jstest.StartWith(t, jstest.Options{SyncAlways: true})
	c, _ := newCommitter(t, env)
	b := topology.BucketClaims
	const n = DefaultMaxBatch
	// Atomic batches on: a first batch finds the bucket allows them.
	if r := commitBatch(t, c, kvMsg(b, "warm-1", "x", 0), kvMsg(b, "warm-2", "x", 0)); r[0].err != nil || c.Stats("KV_"+b).Batches != 1 {
		t.Fatalf("warm-up batch: %v, %+v", r[0].err, c.Stats("KV_"+b))
	}
	for round := range 4 {
		ms := make([]*nats.Msg, n)
		for i := range ms {
			ms[i] = kvMsg(b, fmt.Sprintf("r%d-k%d", round, i), strings.Repeat("x", 200), 0)
		}
		before := c.Stats("KV_" + b)
		answered := make(chan []result, 1)
		go func() { answered <- commitBatch(t, c, ms...) }()
		// Stop the server somewhere in the batch: while it is staged or
		// committed, at a different point each round.
		time.Sleep(time.Duration(round*2) * time.Millisecond)
		env.Restart(t)
		res := <-answered
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		acked, stored := 0, 0
		for i := range n {
			_, err := env.Buckets.Claims.Get(ctx, fmt.Sprintf("r%d-k%d", round, i))
			switch {
			case err == nil:
				stored++
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				t.Fatalf("get: %v", err)
			case res[i].err == nil:
				t.Fatalf("round %d: write %d acknowledged, not stored", round, i)
			}
			if res[i].err == nil {
				acked++
			}
		}
		cancel()
		// A batch the new server refused (its first messages went to the
		// stopped one: "incomplete batch") stored nothing, and its writes
		// went singly, each stored or not on its own. Otherwise the batch
		// is whole or absent.
		after := c.Stats("KV_" + b)
		retried := after.Refused > before.Refused || after.SingleWrites > before.SingleWrites
		t.Logf("round %d: %d of %d writes acknowledged, %d stored, retried singly %v (%+v)", round, acked, n, stored, retried, c.Stats("KV_"+b))
		if !retried && stored != 0 && stored != n {
			t.Fatalf("round %d: %d of %d stored after a broker stop, %d acknowledged: a partial batch", round, stored, n, acked)
		}
	}
}

// On a three-node cluster (R3 buckets) a batch commits with each write's
// own revision, and a refused one answers each write as alone.
func TestBatchOnAReplicatedBucket(t *testing.T) {
	cl := jstest.StartCluster(t, 3)
	topo := topology.DefaultConfig()
	topo.Replicas = 3
	c, err := New(cl.JS[0], Config{Streams: topo.BucketStreams(), MinBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := topology.BucketApprovals
	ctx := jstest.Ctx(t)
	if _, err := cl.Buckets[0].Approvals.Create(ctx, "taken", []byte("x")); err != nil {
		t.Fatal(err)
	}
	res := commitBatch(t, c, kvMsg(b, "a", "A", 0), kvMsg(b, "c", "C", 0))
	if res[0].err != nil || res[1].err != nil || res[1].ack.Sequence != res[0].ack.Sequence+1 {
		t.Fatalf("good batch: %v, %v", res[0], res[1])
	}
	res = commitBatch(t, c, kvMsg(b, "d", "D", 0), kvMsg(b, "taken", "y", 0), kvMsg(b, "e", "E", 0))
	if res[0].err != nil || res[2].err != nil || !errors.Is(res[1].err, jetstream.ErrKeyExists) {
		t.Fatalf("mixed batch: %v, %v, %v", res[0].err, res[1].err, res[2].err)
	}
	for key, r := range map[string]result{"d": res[0], "e": res[2]} {
		e, err := cl.Buckets[0].Approvals.Get(ctx, key)
		if err != nil || e.Revision() != r.ack.Sequence {
			t.Fatalf("%s: %v, %v", key, e, err)
		}
	}
	if st := c.Stats("KV_" + b); st.Batches != 1 || st.Refused != 1 {
		t.Fatalf("stats %+v, want one batch committed and one refused", st)
	}
}

// After a refused batch the next commit goes singly, then batching
// resumes.
func TestRefusalBacksOff(t *testing.T) {
	env := jstest.Start(t)
	c, _ := newCommitter(t, env)
	b := topology.BucketClaims
	if _, err := env.Buckets.Claims.Create(jstest.Ctx(t), "taken", []byte("x")); err != nil {
		t.Fatal(err)
	}
	commitBatch(t, c, kvMsg(b, "a", "A", 0), kvMsg(b, "taken", "y", 0))
	if st := c.Stats("KV_" + b); st.Refused != 1 || st.SingleWrites != 2 {
		t.Fatalf("after the refusal: %+v", st)
	}
	if r := commitBatch(t, c, kvMsg(b, "b", "B", 0), kvMsg(b, "c", "C", 0)); r[0].err != nil || r[1].err != nil {
		t.Fatal(r[0].err, r[1].err)
	}
	if st := c.Stats("KV_" + b); st.Batches != 0 || st.SingleWrites != 4 {
		t.Fatalf("the commit after a refusal: %+v, want it sent singly", st)
	}
	commitBatch(t, c, kvMsg(b, "d", "D", 0), kvMsg(b, "e", "E", 0))
	if st := c.Stats("KV_" + b); st.Batches != 1 {
		t.Fatalf("the commit after the backoff: %+v, want a batch", st)
	}
}

// batchTestN is the size of the batches the broker-stop tests commit: a
// large batch, as under load.
const batchTestN = 40

// stopDuringBatch starts a server (file store, fsync always) and a
// committer on a connection of its own that buffers nothing while
// disconnected (a publish then fails at once, so nothing of a batch
// reaches the restarted server behind the test's back), and commits a
// batch of batchTestN events with message ids. stop is called from
// Config.OnBatch: with the batch staged on the server, before its commit
// message goes out. It returns the batch and each write's answer, once the
// server has restarted and the committer's connection is back.
func stopDuringBatch(t *testing.T, stop func(env *jstest.Env, nc *nats.Conn)) (*jstest.Env, Batch, []*nats.Msg, []result) {
	t.Helper()
	env := jstest.StartWith(t, jstest.Options{SyncAlways: true})
	nc, err := nats.Connect(env.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var seen []Batch
	c, err := New(js, Config{
		Streams: env.Topology.Streams(), MinBatch: 1, AckTimeout: 2 * time.Second,
		OnBatch: func(b Batch) {
			seen = append(seen, b)
			if b.Stream == topology.StreamEvents && len(b.Subjects) == batchTestN {
				stop(env, nc)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]*nats.Msg, batchTestN)
	for i := range ms {
		id := fmt.Sprintf("stop-%02d", i)
		ms[i] = eventMsg(topology.EventSubject(topology.SubjectTurnOutcome, id), id)
	}
	res := commitBatch(t, c, ms...)
	if len(seen) != 1 || seen[0].ID == "" || len(seen[0].MsgIDs) != batchTestN || seen[0].MsgIDs[7] != "stop-07" || seen[0].Subjects[7] != ms[7].Subject {
		t.Fatalf("OnBatch saw %+v, want the one batch of %d writes in order", seen, batchTestN)
	}
	env.Restart(t)
	jstest.Eventually(t, 10*time.Second, "the committer's connection is back", nc.IsConnected)
	return env, seen[0], ms, res
}

// stored reads the events stream: for each message id, how many messages
// carry it, and the Nats-Batch-Sequence of each message batch id wrote.
func stored(t *testing.T, env *jstest.Env, batchID string) (perID map[string]int, batchSeqs []int) {
	t.Helper()
	ctx := jstest.Ctx(t)
	cons, err := env.JS.OrderedConsumer(ctx, topology.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	perID = map[string]int{}
	for left := int(info.NumPending); left > 0; {
		batch, err := cons.Fetch(left, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			perID[m.Headers().Get(jetstream.MsgIDHeader)]++
			if m.Headers().Get(HeaderBatchID) == batchID {
				seq, _ := strconv.Atoi(m.Headers().Get(HeaderBatchSeq))
				batchSeqs = append(batchSeqs, seq)
			}
		}
		if n == 0 {
			t.Fatalf("%d messages pending but none delivered: %v", left, batch.Error())
		}
		left -= n
	}
	return perID, batchSeqs
}

// retryAll publishes every write again, as its writer does after an error
// (same message id), and returns how many the stream called duplicates.
func retryAll(t *testing.T, env *jstest.Env, ms []*nats.Msg) (duplicates int) {
	t.Helper()
	for _, m := range ms {
		ack, err := env.JS.PublishMsg(jstest.Ctx(t), m)
		if err != nil {
			t.Fatalf("retry %s: %v", m.Header.Get(jetstream.MsgIDHeader), err)
		}
		if ack.Duplicate {
			duplicates++
		}
	}
	return duplicates
}

// The broker goes down while a large batch is staged on it, before its
// commit message: nothing of the batch is stored, every writer gets an
// error (none a false success), and a retry of each write after the
// restart stores it exactly once (a second retry is a duplicate).
func TestBrokerDownBeforeBatchCommitStoresNoneAndRetryIsExactlyOnce(t *testing.T) {
	env, b, ms, res := stopDuringBatch(t, func(env *jstest.Env, nc *nats.Conn) {
		env.Server.Shutdown()
		env.Server.WaitForShutdown()
		jstest.Eventually(t, 10*time.Second, "the committer's connection sees the server gone", func() bool { return !nc.IsConnected() })
	})
	for i, r := range res {
		if r.err == nil {
			t.Fatalf("write %d acknowledged (seq %d) though its batch's commit never reached the server", i, r.ack.Sequence)
		}
	}
	if perID, seqs := stored(t, env, b.ID); len(seqs) != 0 || len(perID) != 0 {
		t.Fatalf("after the restart the batch left %d messages (batch sequences %v): want none", len(perID), seqs)
	}
	if dup := retryAll(t, env, ms); dup != 0 {
		t.Fatalf("first retry: %d duplicates, want 0 (nothing was stored)", dup)
	}
	if dup := retryAll(t, env, ms); dup != batchTestN {
		t.Fatalf("second retry: %d duplicates, want %d", dup, batchTestN)
	}
	perID, _ := stored(t, env, b.ID)
	for _, m := range ms {
		if id := m.Header.Get(jetstream.MsgIDHeader); perID[id] != 1 {
			t.Fatalf("%s stored %d times, want once", id, perID[id])
		}
	}
}

// The broker is stopped as a large batch's commit message goes out (the
// stop races the commit): after the restart the batch is stored whole or
// not at all, every acknowledged writer's write is stored, and retrying
// every write with its message id leaves each stored exactly once, the
// retries of a stored batch answered as duplicates.
func TestBrokerStopAsBatchCommitsIsAllOrNoneAndRetryIsExactlyOnce(t *testing.T) {
	env, b, ms, res := stopDuringBatch(t, func(env *jstest.Env, _ *nats.Conn) {
		go env.Server.Shutdown()
	})
	_, seqs := stored(t, env, b.ID)
	slices.Sort(seqs)
	whole := len(seqs) == batchTestN && seqs[0] == 1 && seqs[batchTestN-1] == batchTestN
	acked := 0
	for i, r := range res {
		if r.err == nil {
			acked++
			if !whole {
				t.Fatalf("write %d acknowledged but its batch is not stored (batch sequences %v)", i, seqs)
			}
		}
	}
	t.Logf("batch stored whole: %v; %d of %d writers acknowledged", whole, acked, batchTestN)
	if !whole && len(seqs) != 0 {
		t.Fatalf("partial batch after a broker stop: batch sequences %v of 1..%d", seqs, batchTestN)
	}
	want := 0
	if whole {
		want = batchTestN
	}
	if dup := retryAll(t, env, ms); dup != want {
		t.Fatalf("retry: %d duplicates, want %d (batch stored whole: %v)", dup, want, whole)
	}
	perID, _ := stored(t, env, b.ID)
	for _, m := range ms {
		if id := m.Header.Get(jetstream.MsgIDHeader); perID[id] != 1 {
			t.Fatalf("%s stored %d times, want once", id, perID[id])
		}
	}
}
