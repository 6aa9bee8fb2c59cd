package topology_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Streams and buckets made by a version before the group committer (no
// atomic batch publish) show allow_atomic in Plan, make Check (a stage
// with --no-provision) refuse naming it, and are converged by Ensure (what
// `tollgate provision` runs), keeping what they hold.
func TestStreamsWithoutAtomicPublishAreConverged(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	old := func() {
		t.Helper()
		for _, sc := range append(cfg.Streams(), cfg.BucketStreams()...) {
			sc.AllowAtomicPublish = false
			if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
		}
	}
	old()
	// That version had no turn logs (OpenBuckets, which needs them, could
	// not run): bind the batches bucket alone.
	batches, err := js.KeyValue(ctx, topology.BucketBatches)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := batches.Create(ctx, "t1", []byte("running batch")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, topology.AcceptedSubject("s1"), []byte("turn")); err != nil {
		t.Fatal(err)
	}

	changes, err := topology.Plan(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names, missing []string
	for _, c := range changes {
		if c.Missing {
			missing = append(missing, c.Name)
			continue
		}
		if len(c.Fields) != 1 || c.Fields[0] != (topology.FieldDiff{Field: "allow_atomic", Have: "false", Want: "true"}) {
			t.Errorf("change %s, want only allow_atomic false -> true", c)
		}
		names = append(names, c.Name)
	}
	want := []string{topology.StreamInbound, topology.StreamTurns, topology.StreamDecisions, topology.StreamEvents, topology.StreamDLQ,
		topology.BucketApprovals, topology.BucketBatches, topology.BucketSessions, topology.BucketClaims, topology.BucketGrants, topology.BucketWebSessions}
	if !slices.Equal(names, want) {
		t.Fatalf("Plan names %v, want %v", names, want)
	}
	// That version had no turn logs either: they are missing, no more.
	var wantMissing []string
	for _, sc := range cfg.TurnLogStreams() {
		wantMissing = append(wantMissing, sc.Name)
	}
	if !slices.Equal(missing, wantMissing) {
		t.Fatalf("Plan names missing %v, want the turn logs %v", missing, wantMissing)
	}
	err = topology.Check(ctx, js, cfg, nil)
	if !errors.Is(err, topology.ErrNotProvisioned) || !strings.Contains(err.Error(), "bucket tollgate_batches: allow_atomic false, want true") {
		t.Fatalf("Check: %v, want ErrNotProvisioned naming allow_atomic", err)
	}

	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if changes, err := topology.Plan(ctx, js, cfg, nil); err != nil || len(changes) != 0 {
		t.Fatalf("Plan after Ensure: %v, %v; want nothing", changes, err)
	}
	for _, sc := range append(cfg.Streams(), cfg.BucketStreams()...) {
		s, err := js.Stream(ctx, sc.Name)
		if err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("stream %s after Ensure: %v, allow_atomic off", sc.Name, err)
		}
	}
	if e, err := batches.Get(ctx, "t1"); err != nil || string(e.Value()) != "running batch" {
		t.Fatalf("batch record after the update: %v, %v", e, err)
	}
	if s, _ := js.Stream(ctx, topology.StreamTurns); s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("turns stream holds %d messages after the update, want 1", s.CachedInfo().State.Msgs)
	}
}
