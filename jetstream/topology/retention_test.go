package topology_test

import (
	"slices"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Buckets made before records had a retention (their streams do not allow
// per-message TTLs) show the difference in Plan, and Ensure (what
// `tollgate provision` and a provisioning stage run) converges them, keeping
// the records they hold.
func TestBucketsWithoutMessageTTLsAreConverged(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	// The servers' streams as an older Tollgate made them: recreated
	// without AllowMsgTTL (a server never turns it off on an update).
	for _, sc := range cfg.BucketStreams() {
		if err := js.DeleteStream(ctx, sc.Name); err != nil {
			t.Fatal(err)
		}
		sc.AllowMsgTTL = false
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	b, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claims.Create(ctx, "c1", []byte("claim")); err != nil {
		t.Fatal(err)
	}

	changes, err := topology.Plan(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range changes {
		if c.Kind != topology.KindBucket || len(c.Fields) != 1 || c.Fields[0] != (topology.FieldDiff{Field: "allow_msg_ttl", Have: "false", Want: "true"}) {
			t.Errorf("change %s, want only allow_msg_ttl false -> true", c)
		}
		names = append(names, c.Name)
	}
	want := []string{topology.BucketApprovals, topology.BucketBatches, topology.BucketSessions, topology.BucketClaims, topology.BucketGrants, topology.BucketWebSessions}
	if !slices.Equal(names, want) {
		t.Fatalf("Plan names %v, want %v", names, want)
	}

	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if changes, err := topology.Plan(ctx, js, cfg, nil); err != nil || len(changes) != 0 {
		t.Fatalf("Plan after Ensure: %v, %v; want nothing", changes, err)
	}
	if e, err := b.Claims.Get(ctx, "c1"); err != nil || string(e.Value()) != "claim" {
		t.Fatalf("claim after the update: %v, %v", e, err)
	}
}
