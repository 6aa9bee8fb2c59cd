package topology_test

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The streams Ensure writes for the buckets are what nats.go's
// CreateKeyValue makes of the same KeyValueConfig (so the buckets are
// ordinary KV buckets to every client and tool), with one replica, except
// that they allow per-message TTLs (which a KeyValueConfig turns on only
// together with limit markers), and so need that API level of the server.
// Whether they allow atomic batch publish is left out: Plan and Ensure
// ignore it (see streamDiff).
func TestBucketStreamsAreWhatNATSMakesOfTheBuckets(t *testing.T) {
	_, js, ctx := bare(t)
	_, other, _ := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, kc := range cfg.Buckets() {
		if _, err := other.CreateKeyValue(ctx, kc); err != nil {
			t.Fatalf("CreateKeyValue %s: %v", kc.Bucket, err)
		}
		ours, err := js.Stream(ctx, "KV_"+kc.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := other.Stream(ctx, "KV_"+kc.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		a, b := ours.CachedInfo().Config, theirs.CachedInfo().Config
		if !a.AllowMsgTTL {
			t.Errorf("bucket %s does not allow per-message TTLs", kc.Bucket)
		}
		b.AllowMsgTTL, b.AllowAtomicPublish, b.Metadata["_nats.req.level"] = true, a.AllowAtomicPublish, a.Metadata["_nats.req.level"]
		if !reflect.DeepEqual(a, b) {
			t.Errorf("bucket %s\nEnsure:         %+v\nCreateKeyValue: %+v", kc.Bucket, a, b)
		}
	}
}

// On a three-node cluster with Replicas 3 every stream, bucket and turn
// log has three replicas, no bucket or turn log allows direct gets (a follower could answer a read
// with a value older than an acknowledged write), and a second Ensure keeps
// it so, and the data. A topology first created with one replica (a cluster
// started without --replicas) is converged to three.
func TestEnsureOnAThreeNodeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped with -short")
	}
	c := jstest.StartCluster(t, 3) // ensured with Replicas 3
	ctx := jstest.Ctx(t)
	js := c.JS[1]
	check := func(when string) {
		t.Helper()
		cfg := topology.DefaultConfig()
		for _, want := range append(append(cfg.Streams(), cfg.BucketStreams()...), cfg.TurnLogStreams()...) {
			s, err := js.Stream(ctx, want.Name)
			if err != nil {
				t.Fatalf("%s: %s: %v", when, want.Name, err)
			}
			info := s.CachedInfo()
			if info.Config.Replicas != 3 || info.Config.AllowDirect {
				t.Errorf("%s: %s: replicas %d, allow direct %v; want 3, false", when, want.Name, info.Config.Replicas, info.Config.AllowDirect)
			}
			// A stream scaled up reports its new peers once they have
			// joined its group: wait for that, not for the first answer.
			jstest.EventuallyState(t, 30*time.Second, when+": "+want.Name+" led with two replicas", func() (bool, string) {
				info, err := s.Info(ctx)
				if err != nil {
					return false, err.Error()
				}
				return info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == 2, fmt.Sprintf("cluster %+v", info.Cluster)
			})
		}
	}
	check("after Ensure")

	r3 := topology.DefaultConfig()
	r3.Replicas = 3
	kv, err := js.KeyValue(ctx, topology.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "c-1", []byte("claimed")); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, js, r3); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	check("after a second Ensure")
	if e, err := kv.Get(ctx, "c-1"); err != nil || string(e.Value()) != "claimed" {
		t.Errorf("claim after the second Ensure: %v", err)
	}

	// From one replica (with direct gets) to three (without).
	for _, sc := range r3.BucketStreams() {
		sc.Replicas, sc.AllowDirect = 1, true
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			t.Fatalf("scale %s down: %v", sc.Name, err)
		}
	}
	if err := topology.Ensure(ctx, js, r3); err != nil {
		t.Fatalf("Ensure over R1 buckets: %v", err)
	}
	check("after converging R1 buckets")
	if _, err := js.KeyValue(ctx, topology.BucketSessions); err != nil {
		t.Errorf("bind the converged bucket: %v", err)
	}
}

// Stage processes starting together on a fresh cluster all run Ensure at
// once; each must succeed (nats-server can leave concurrent creations of
// one stream unanswered: Ensure tries again).
func TestConcurrentEnsureOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped with -short")
	}
	c := jstest.StartBareCluster(t, 3)
	ctx := jstest.Ctx(t)
	cfg := topology.DefaultConfig()
	cfg.Replicas = 3
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// One connection each, as separate processes would have.
			nc := connect(t, c.Servers[i%3].ClientURL())
			js, err := jetstream.New(nc)
			if err != nil {
				t.Error(err)
				return
			}
			if err := topology.Ensure(ctx, js, cfg); err != nil {
				t.Errorf("Ensure %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if _, err := topology.OpenBuckets(ctx, c.JS[2]); err != nil {
		t.Errorf("open buckets: %v", err)
	}
}
