package topology_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// TestAPlannerBucketOfAnEarlierVersionIsUpgraded: the planner's bucket as
// an earlier version made it (five revisions per key, no per-message TTLs)
// is refused by a planner that may only check (naming what differs), and
// EnsurePlannerBucket updates it in place, records kept: one revision per
// key, TTLs allowed, after which the check passes.
func TestAPlannerBucketOfAnEarlierVersionIsUpgraded(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	c := topology.DefaultConfig()
	old := c.PlannerBucket()
	old.History = 5
	kv, err := env.JS.CreateKeyValue(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "t-kept", []byte("a record of the earlier version")); err != nil {
		t.Fatal(err)
	}

	_, err = topology.CheckPlannerBucket(ctx, env.JS, c)
	if err == nil || !strings.Contains(err.Error(), "allow_msg_ttl") || !strings.Contains(err.Error(), "history") || !strings.Contains(err.Error(), "tollgate provision --planner") {
		t.Fatalf("check of the earlier bucket: %v, want it refused naming allow_msg_ttl and history", err)
	}

	if _, err := topology.EnsurePlannerBucket(ctx, env.JS, c); err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx, "KV_"+topology.BucketPlanner)
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.CachedInfo().Config; !sc.AllowMsgTTL || sc.MaxMsgsPerSubject != 1 || sc.Storage != jetstream.FileStorage {
		t.Fatalf("upgraded bucket: allow_msg_ttl %v, history %d, storage %v", sc.AllowMsgTTL, sc.MaxMsgsPerSubject, sc.Storage)
	}
	if e, err := kv.Get(ctx, "t-kept"); err != nil || string(e.Value()) != "a record of the earlier version" {
		t.Fatalf("the earlier record after the upgrade: %v", err)
	}
	if _, err := topology.CheckPlannerBucket(ctx, env.JS, c); err != nil {
		t.Fatalf("check after the upgrade: %v", err)
	}
}
