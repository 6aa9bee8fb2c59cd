package topology_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Streams and buckets made by an earlier version, which turned atomic
// batch publish on for its group committer (since removed), are
// provisioned as they are: Plan reports no difference, Check (a stage
// with --no-provision) accepts them, and Ensure leaves them alone. A
// stream that drifted in another setting is converged by Ensure all the
// same.
func TestStreamsThatAllowAtomicPublishAreNotDrift(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	var earlier []jetstream.StreamConfig
	for _, sc := range append(cfg.Streams(), cfg.BucketStreams()...) {
		sc.AllowAtomicPublish = true
		earlier = append(earlier, sc)
	}
	for _, sc := range append(earlier, cfg.TurnLogStreams()...) {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}

	if changes, err := topology.Plan(ctx, js, cfg, nil); err != nil || len(changes) != 0 {
		t.Fatalf("Plan: %v, %v; want nothing", changes, err)
	}
	if err := topology.Check(ctx, js, cfg, nil); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, sc := range earlier {
		s, err := js.Stream(ctx, sc.Name)
		if err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("stream %s after Ensure: %v, allow_atomic turned off: Ensure rewrote it", sc.Name, err)
		}
	}

	drifted := earlier[0]
	drifted.Description = "changed by hand"
	if _, err := js.UpdateStream(ctx, drifted); err != nil {
		t.Fatal(err)
	}
	changes, err := topology.Plan(ctx, js, cfg, nil)
	if err != nil || len(changes) != 1 || len(changes[0].Fields) != 1 || changes[0].Fields[0].Field != "description" {
		t.Fatalf("Plan after a change of %s's description: %v, %v; want that change alone", drifted.Name, changes, err)
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if changes, err := topology.Plan(ctx, js, cfg, nil); err != nil || len(changes) != 0 {
		t.Fatalf("Plan after Ensure: %v, %v; want nothing", changes, err)
	}
}
