package topology_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// consumers are the stage consumers with every setting ConsumerDiff
// compares given, as a stage's runner gives them.
func consumers() []topology.ConsumerSpec {
	specs := topology.Consumers()
	for i := range specs {
		c := &specs[i].Config
		c.AckPolicy, c.AckWait, c.MaxDeliver, c.MaxAckPending = jetstream.AckExplicitPolicy, 30*time.Second, -1, 1024
	}
	return specs
}

// On an empty server Plan lists every stream, bucket, turn-log stream
// (TOLLGATE_TURNLOG_0..3) and consumer as missing and changes nothing; Check refuses with ErrNotProvisioned and
// names each of them.
func TestPlanAndCheckOnAnEmptyServerNameEverythingMissing(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	changes, err := topology.Plan(ctx, js, cfg, consumers())
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range cfg.Streams() {
		want = append(want, "stream "+s.Name+": missing")
	}
	for _, b := range cfg.Buckets() {
		want = append(want, "bucket "+b.Bucket+": missing")
	}
	for _, s := range cfg.TurnLogStreams() {
		want = append(want, "stream "+s.Name+": missing")
	}
	if n := len(cfg.TurnLogStreams()); n != topology.DefaultTurnLogPartitions {
		t.Fatalf("%d turn-log streams in the default topology, want %d", n, topology.DefaultTurnLogPartitions)
	}
	for _, c := range consumers() {
		want = append(want, "consumer "+c.Stream+"/"+c.Config.Durable+": missing")
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Plan on an empty server:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		t.Errorf("Plan created stream %s", name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	err = topology.Check(ctx, js, cfg, consumers())
	if !errors.Is(err, topology.ErrNotProvisioned) {
		t.Fatalf("Check on an empty server: %v, want ErrNotProvisioned", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check's error does not name %q: %v", w, err)
		}
	}
}

// Once Ensure and EnsureConsumer have run, Plan finds nothing and Check
// passes; a setting changed afterwards shows as that field's difference,
// with the value on the server and the value wanted, and fails Check.
func TestPlanShowsWhatDiffersFieldByField(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range consumers() {
		if _, err := topology.EnsureConsumer(ctx, js, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := topology.Check(ctx, js, cfg, consumers()); err != nil {
		t.Fatalf("Check after provisioning: %v", err)
	}

	drifted := bucketStream(t, cfg, topology.BucketSessions)
	drifted.MaxMsgsPerSubject = 7
	if _, err := js.UpdateStream(ctx, drifted); err != nil {
		t.Fatal(err)
	}
	executor := consumers()[1]
	changed := executor.Config
	changed.AckWait = time.Minute
	if _, err := js.UpdateConsumer(ctx, executor.Stream, changed); err != nil {
		t.Fatal(err)
	}
	changes, err := topology.Plan(ctx, js, cfg, consumers())
	if err != nil {
		t.Fatal(err)
	}
	want := []topology.Change{
		{Kind: topology.KindBucket, Name: topology.BucketSessions, Fields: []topology.FieldDiff{{Field: "history", Have: "7", Want: "1"}}},
		{Kind: topology.KindConsumer, Name: topology.StreamTurns + "/" + topology.ConsumerExecutor, Fields: []topology.FieldDiff{{Field: "ack_wait", Have: "1m0s", Want: "30s"}}},
	}
	if len(changes) != len(want) {
		t.Fatalf("Plan: %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i].String() != want[i].String() {
			t.Errorf("change %d: %s, want %s", i, changes[i], want[i])
		}
	}
	if err := topology.Check(ctx, js, cfg, consumers()); !errors.Is(err, topology.ErrNotProvisioned) || !strings.Contains(err.Error(), "history 7, want 1") {
		t.Fatalf("Check after a change: %v, want ErrNotProvisioned naming the history", err)
	}

	// EnsureConsumer converges the consumer back.
	if _, err := topology.EnsureConsumer(ctx, js, executor); err != nil {
		t.Fatal(err)
	}
	changes, err = topology.Plan(ctx, js, cfg, consumers())
	if err != nil || len(changes) != 1 || changes[0].Kind != topology.KindBucket {
		t.Fatalf("after EnsureConsumer: %v, %v; want only the bucket's change left", changes, err)
	}
}
