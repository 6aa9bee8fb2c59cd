package topology_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// bare starts an embedded server with JetStream and no Tollgate topology.
func bare(t *testing.T) (*nats.Conn, jetstream.JetStream, context.Context) {
	t.Helper()
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc := connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return nc, js, ctx
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestValidate(t *testing.T) {
	def := topology.DefaultConfig()
	with := func(f func(*topology.Config)) topology.Config {
		c := def
		f(&c)
		return c
	}
	cases := []struct {
		name  string
		cfg   topology.Config
		valid bool
	}{
		{"the default", def, true},
		{"three replicas", with(func(c *topology.Config) { c.Replicas = 3 }), true},
		{"five replicas", with(func(c *topology.Config) { c.Replicas = 5 }), true},
		{"memory storage", with(func(c *topology.Config) { c.Storage = jetstream.MemoryStorage }), true},
		{"duplicate window equal to max age", with(func(c *topology.Config) { c.DuplicateWindow = c.MaxAge }), true},
		{"one turn-log partition", with(func(c *topology.Config) { c.TurnLogPartitions = 1 }), true},
		{"the most turn-log partitions", with(func(c *topology.Config) { c.TurnLogPartitions = topology.MaxTurnLogPartitions }), true},

		{"the zero config", topology.Config{}, false},
		{"zero replicas", with(func(c *topology.Config) { c.Replicas = 0 }), false},
		{"negative replicas", with(func(c *topology.Config) { c.Replicas = -1 }), false},
		{"six replicas", with(func(c *topology.Config) { c.Replicas = 6 }), false},
		{"zero max age (keep forever is not a choice here)", with(func(c *topology.Config) { c.MaxAge = 0 }), false},
		{"negative max age", with(func(c *topology.Config) { c.MaxAge = -time.Hour }), false},
		{"zero duplicate window", with(func(c *topology.Config) { c.DuplicateWindow = 0 }), false},
		{"negative duplicate window", with(func(c *topology.Config) { c.DuplicateWindow = -time.Second }), false},
		{"duplicate window longer than max age", with(func(c *topology.Config) {
			c.MaxAge = time.Hour
			c.DuplicateWindow = 2 * time.Hour
		}), false},
		{"negative turn-log partitions", with(func(c *topology.Config) { c.TurnLogPartitions = -1 }), false},
		{"more turn-log partitions than the most", with(func(c *topology.Config) { c.TurnLogPartitions = topology.MaxTurnLogPartitions + 1 }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.valid && err != nil {
				t.Errorf("Validate: %v, want nil", err)
			}
			if !tc.valid && err == nil {
				t.Errorf("Validate accepted %+v", tc.cfg)
			}
		})
	}
}

func TestEnsureRejectsInvalidConfigWithoutTouchingTheServer(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	cfg.Replicas = 0
	if err := topology.Ensure(ctx, js, cfg); err == nil {
		t.Fatal("Ensure accepted zero replicas")
	}
	if names := streamNames(t, ctx, js); len(names) != 0 {
		t.Errorf("streams created by a rejected Ensure: %v", names)
	}
}

func TestEnsureFailsRatherThanDowngradingReplicas(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	cfg.Replicas = 3
	if err := topology.Ensure(ctx, js, cfg); err == nil {
		t.Fatal("Ensure with 3 replicas succeeded on a single server")
	}
}

func streamNames(t *testing.T, ctx context.Context, js jetstream.JetStream) []string {
	t.Helper()
	var names []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	sort.Strings(names)
	return names
}

// snapshot is what Ensure controls: every stream's and bucket's config.
type snapshot struct {
	streams map[string]jetstream.StreamConfig
	buckets map[string]jetstream.KeyValueConfig
}

func take(t *testing.T, ctx context.Context, js jetstream.JetStream) snapshot {
	t.Helper()
	s := snapshot{streams: map[string]jetstream.StreamConfig{}, buckets: map[string]jetstream.KeyValueConfig{}}
	for _, sc := range append(topology.DefaultConfig().Streams(), topology.DefaultConfig().TurnLogStreams()...) {
		st, err := js.Stream(ctx, sc.Name)
		if err != nil {
			t.Fatalf("stream %s: %v", sc.Name, err)
		}
		s.streams[sc.Name] = st.CachedInfo().Config
	}
	for _, kc := range topology.DefaultConfig().Buckets() {
		kv, err := js.KeyValue(ctx, kc.Bucket)
		if err != nil {
			t.Fatalf("bucket %s: %v", kc.Bucket, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		s.buckets[kc.Bucket] = jetstream.KeyValueConfig{
			Bucket: kc.Bucket, History: uint8(st.History()), Storage: info.Config.Storage,
			Replicas: info.Config.Replicas, MaxValueSize: info.Config.MaxMsgSize,
		}
	}
	return s
}

func TestEnsureIsIdempotent(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("first Ensure: %v", err)
	}
	first := take(t, ctx, js)

	// Data written between two Ensures survives the second.
	if _, err := js.Publish(ctx, topology.InboundSubject("slack", "s1"), []byte("m1")); err != nil {
		t.Fatal(err)
	}
	b, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claims.Put(ctx, "c-1", []byte("claimed")); err != nil {
		t.Fatal(err)
	}

	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	second := take(t, ctx, js)
	if !reflect.DeepEqual(first, second) {
		t.Errorf("configs changed on the second Ensure\nfirst  %+v\nsecond %+v", first, second)
	}
	want := []string{
		"KV_" + topology.BucketApprovals, "KV_" + topology.BucketBatches, "KV_" + topology.BucketClaims, "KV_" + topology.BucketSessions,
		"KV_" + topology.BucketGrants, "KV_" + topology.BucketWebSessions, topology.StreamDecisions, topology.StreamDLQ, topology.StreamEvents, topology.StreamInbound, topology.StreamTurns,
		"TOLLGATE_TURNLOG_0", "TOLLGATE_TURNLOG_1", "TOLLGATE_TURNLOG_2", "TOLLGATE_TURNLOG_3",
	}
	sort.Strings(want)
	if got := streamNames(t, ctx, js); !reflect.DeepEqual(got, want) {
		t.Errorf("streams %v, want %v", got, want)
	}
	st, err := js.Stream(ctx, topology.StreamInbound)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("inbound stream holds %d messages after the second Ensure, want 1", n)
	}
	e, err := b.Claims.Get(ctx, "c-1")
	if err != nil || string(e.Value()) != "claimed" {
		t.Errorf("claim after the second Ensure: %v", err)
	}

	for name, sc := range second.streams {
		if sc.MaxAge != cfg.MaxAge || sc.Duplicates != cfg.DuplicateWindow || sc.Storage != jetstream.FileStorage || sc.Replicas != 1 {
			t.Errorf("%s: max age %v, duplicates %v, storage %v, replicas %d", name, sc.MaxAge, sc.Duplicates, sc.Storage, sc.Replicas)
		}
		if sc.Retention != jetstream.LimitsPolicy {
			t.Errorf("%s: retention %v; replay needs history kept by limits, not by acks", name, sc.Retention)
		}
	}
	for name, kc := range second.buckets {
		if kc.Storage != jetstream.FileStorage || kc.History == 0 {
			t.Errorf("bucket %s: %+v", name, kc)
		}
	}
}

func TestConcurrentEnsure(t *testing.T) {
	nc, _, ctx := bare(t)
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One connection each, as separate processes would have.
			c, err := nats.Connect(nc.ConnectedUrl())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			js, err := jetstream.New(c)
			if err != nil {
				errs <- err
				return
			}
			errs <- topology.Ensure(ctx, js, topology.DefaultConfig())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Ensure: %v", err)
		}
	}
	js, _ := jetstream.New(nc)
	if _, err := topology.OpenBuckets(ctx, js); err != nil {
		t.Errorf("open buckets after concurrent Ensure: %v", err)
	}
	if got := len(streamNames(t, ctx, js)); got != 15 {
		t.Errorf("%d streams after concurrent Ensure, want 5 streams, 6 buckets and 4 turn logs", got)
	}
	if logs, err := topology.OpenTurnLogs(ctx, js); err != nil || len(logs) != topology.DefaultTurnLogPartitions {
		t.Errorf("turn logs after concurrent Ensure: %d, %v; want %d", len(logs), err, topology.DefaultTurnLogPartitions)
	}
}

// Ensure converges a stream that drifted (created by hand, or by an older
// release) to the configured settings.
func TestEnsureConvergesDriftedStream(t *testing.T) {
	_, js, ctx := bare(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     topology.StreamEvents,
		Subjects: []string{"tollgate.event.>"},
		MaxAge:   time.Hour,
		Storage:  jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("Ensure over a drifted stream: %v", err)
	}
	st, err := js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	got := st.CachedInfo().Config
	if got.MaxAge != cfg.MaxAge || got.Duplicates != cfg.DuplicateWindow || got.MaxMsgSize != 1<<20 {
		t.Errorf("drifted stream not converged: max age %v, duplicates %v, max msg size %d", got.MaxAge, got.Duplicates, got.MaxMsgSize)
	}
}

func TestOpenBuckets(t *testing.T) {
	t.Run("before Ensure it fails with ErrBucketNotFound", func(t *testing.T) {
		_, js, ctx := bare(t)
		b, err := topology.OpenBuckets(ctx, js)
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Fatalf("OpenBuckets: %v, want ErrBucketNotFound", err)
		}
		if b.Approvals != nil || b.Batches != nil || b.Sessions != nil || b.Claims != nil {
			t.Errorf("OpenBuckets returned handles with its error: %+v", b)
		}
	})
	t.Run("after Ensure it binds every bucket", func(t *testing.T) {
		_, js, ctx := bare(t)
		if err := topology.Ensure(ctx, js, topology.DefaultConfig()); err != nil {
			t.Fatal(err)
		}
		b, err := topology.OpenBuckets(ctx, js)
		if err != nil {
			t.Fatalf("OpenBuckets: %v", err)
		}
		for want, kv := range map[string]jetstream.KeyValue{
			topology.BucketApprovals: b.Approvals, topology.BucketBatches: b.Batches,
			topology.BucketSessions: b.Sessions, topology.BucketClaims: b.Claims, topology.BucketGrants: b.Grants,
		} {
			if kv == nil || kv.Bucket() != want {
				t.Errorf("bucket %s bound to %v", want, kv)
			}
		}
		if b.JS != js {
			t.Errorf("Buckets.JS is %v, want the JetStream they were opened on", b.JS)
		}
		if len(b.TurnLogs) != topology.DefaultTurnLogPartitions {
			t.Fatalf("%d turn logs bound, want %d", len(b.TurnLogs), topology.DefaultTurnLogPartitions)
		}
		for i, s := range b.TurnLogs {
			if s.CachedInfo().Config.Name != topology.TurnLogStream(i) {
				t.Errorf("turn log %d bound to %s", i, s.CachedInfo().Config.Name)
			}
		}
	})
	t.Run("with the buckets but no turn logs it fails with ErrStreamNotFound", func(t *testing.T) {
		_, js, ctx := bare(t)
		cfg := topology.DefaultConfig()
		if err := topology.Ensure(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
		for _, sc := range cfg.TurnLogStreams() {
			if err := js.DeleteStream(ctx, sc.Name); err != nil {
				t.Fatal(err)
			}
		}
		b, err := topology.OpenBuckets(ctx, js)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("OpenBuckets without the turn logs: %v, want ErrStreamNotFound", err)
		}
		if b.Batches != nil || b.TurnLogs != nil || b.JS != nil {
			t.Errorf("OpenBuckets returned handles with its error: %+v", b)
		}
	})
}

// Every subject a stage publishes on is captured by exactly the stream that
// is meant to hold it.
func TestSubjectsLandInTheirStreams(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	cases := []struct {
		subject string
		stream  string
	}{
		{topology.InboundSubject("slack", "s1"), topology.StreamInbound},
		{topology.AcceptedSubject("s-0123456789abcdef0123456789abcdef"), topology.StreamTurns},
		{topology.ReadySubject("s-0123456789abcdef0123456789abcdef"), topology.StreamTurns},
		{topology.DecisionSubject("slack", "a-7d207e1f030d85151eb8-0"), topology.StreamDecisions},
		{topology.EventSubject(topology.SubjectApprovalRequested, "t-7d207e1f030d85151eb8"), topology.StreamEvents},
		{topology.EventSubject(topology.SubjectApprovalDecided, "t-7d207e1f030d85151eb8"), topology.StreamEvents},
		{topology.EventSubject(topology.SubjectDecisionRejected, "invalid"), topology.StreamEvents},
		{topology.EventSubject(topology.SubjectBatchAwaiting, "t-7d207e1f030d85151eb8"), topology.StreamEvents},
		{topology.EventSubject(topology.SubjectRedrive, "started.t-7d207e1f030d85151eb8"), topology.StreamEvents},
		{topology.EventSubject(topology.SubjectTurnOutcome, "t-7d207e1f030d85151eb8"), topology.StreamEvents},
		{topology.DLQSubject("executor"), topology.StreamDLQ},
	}
	for _, tc := range cases {
		t.Run(tc.subject, func(t *testing.T) {
			ack, err := env.JS.Publish(ctx, tc.subject, []byte("x"))
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			if ack.Stream != tc.stream {
				t.Errorf("stored in %s, want %s", ack.Stream, tc.stream)
			}
		})
	}
	t.Run("a subject outside the topology is not stored", func(t *testing.T) {
		_, err := env.JS.Publish(ctx, "tollgate.other.x", []byte("x"))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("publish outside the topology: %v, want no stream response", err)
		}
	})
}

func TestStreamsAndBucketsAreDistinct(t *testing.T) {
	cfg := topology.DefaultConfig()
	seen := map[string]bool{}
	for _, sc := range cfg.Streams() {
		if seen[sc.Name] {
			t.Errorf("stream %s listed twice", sc.Name)
		}
		seen[sc.Name] = true
		if sc.MaxMsgSize != 1<<20 {
			t.Errorf("%s: max message size %d", sc.Name, sc.MaxMsgSize)
		}
	}
	for _, kc := range cfg.Buckets() {
		name := fmt.Sprintf("KV_%s", kc.Bucket)
		if seen[name] {
			t.Errorf("bucket %s listed twice", kc.Bucket)
		}
		seen[name] = true
	}
	for _, sc := range cfg.TurnLogStreams() {
		if seen[sc.Name] {
			t.Errorf("turn-log stream %s listed twice", sc.Name)
		}
		seen[sc.Name] = true
		if sc.MaxMsgSize != 1<<20 {
			t.Errorf("%s: max message size %d", sc.Name, sc.MaxMsgSize)
		}
	}
	if len(seen) != 15 {
		t.Errorf("%d streams, buckets and turn logs, want 15", len(seen))
	}
}

// A second Ensure over a topology that already matches writes nothing: no
// stream or bucket is updated (many workers start at once, and rewriting a
// stream's config while peers create consumers on it is needless churn).
// A drifted bucket is still converged.
func TestEnsureLeavesAMatchingTopologyAlone(t *testing.T) {
	nc, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	updates := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("$JS.EVENT.ADVISORY.STREAM.UPDATED.>", updates)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	// A marker update, whose advisory arrives after any Ensure caused.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MARKER", Subjects: []string{"marker"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "MARKER", Subjects: []string{"marker"}, MaxMsgs: 10}); err != nil {
		t.Fatal(err)
	}
wait:
	for {
		select {
		case m := <-updates:
			if m.Subject == "$JS.EVENT.ADVISORY.STREAM.UPDATED.MARKER" {
				break wait
			}
			t.Fatalf("Ensure over a matching topology updated %s", m.Subject)
		case <-jstest.After(jstest.Wait):
			t.Fatal("no advisory for the marker update")
		}
	}

	kv, err := js.KeyValue(ctx, topology.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	drifted := bucketStream(t, cfg, topology.BucketSessions)
	drifted.MaxMsgsPerSubject = 7
	if _, err := js.UpdateStream(ctx, drifted); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != 1 {
		t.Fatalf("drifted bucket history %d, want it converged to 1", st.History())
	}
}

// Limits Ensure leaves unset are part of what it converges: a turns stream
// capped by hand (which would silently discard queued turns) and a bucket
// given a TTL (an expiring claim could let a call run twice) are reset.
func TestEnsureResetsLimitsItDoesNotSet(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	turns := cfg.Streams()[1]
	if turns.Name != topology.StreamTurns {
		t.Fatalf("stream order changed: %s", turns.Name)
	}
	capped := turns
	capped.MaxMsgsPerSubject, capped.MaxMsgs = 1, 10
	if _, err := js.UpdateStream(ctx, capped); err != nil {
		t.Fatal(err)
	}
	aged := bucketStream(t, cfg, topology.BucketClaims)
	aged.MaxAge = time.Hour
	if _, err := js.UpdateStream(ctx, aged); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxMsgsPerSubject != -1 || c.MaxMsgs != -1 {
		t.Fatalf("turns stream still capped: per subject %d, msgs %d", c.MaxMsgsPerSubject, c.MaxMsgs)
	}
	kv, err := js.KeyValue(ctx, topology.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 0 {
		t.Fatalf("claims bucket still has a TTL of %v", st.TTL())
	}
}

// bucketStream is the configuration of bucket's stream in cfg.
func bucketStream(t *testing.T, cfg topology.Config, bucket string) jetstream.StreamConfig {
	t.Helper()
	for _, sc := range cfg.BucketStreams() {
		if sc.Name == "KV_"+bucket {
			return sc
		}
	}
	t.Fatalf("no bucket %s", bucket)
	return jetstream.StreamConfig{}
}
