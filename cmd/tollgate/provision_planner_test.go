package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// provision --planner also creates the planner's bucket and its two
// consumers, so that a planner whose user may not create them (or one
// started with --no-provision) finds them; run again, it finds nothing to
// change. Without --planner none of them is made.
func TestProvisionPlannerCreatesItsBucketAndConsumers(t *testing.T) {
	url, js := provEmptyServer(t)
	if code, _, errOut := runCLI(t, "provision", "--nats", url); code != 0 {
		t.Fatalf("provision: exit %d, stderr %q", code, errOut)
	}
	if _, err := js.KeyValue(provCtx(t), topology.BucketPlanner); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("bucket %s without --planner: %v, want not found", topology.BucketPlanner, err)
	}

	code, out, errOut := runCLI(t, "provision", "--planner", "--nats", url)
	if code != 0 {
		t.Fatalf("provision --planner: exit %d, stderr %q", code, errOut)
	}
	want := []string{"create bucket " + topology.BucketPlanner}
	for _, c := range append(topology.PlannerConsumers(), topology.IngestStepsConsumer()) {
		want = append(want, "create consumer "+c.Stream+"/"+c.Config.Durable)
	}
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output does not list %s:\n%s", w, out)
		}
	}
	if _, err := js.KeyValue(provCtx(t), topology.BucketPlanner); err != nil {
		t.Fatalf("bucket %s after provision --planner: %v", topology.BucketPlanner, err)
	}
	all := append(tollgate.AllStages(), tollgate.StagePlanner)
	if err := topology.Check(provCtx(t), js, topology.DefaultConfig(), append(tollgate.StageConsumers(all...), tollgate.IngestPlanConsumer())); err != nil {
		t.Fatalf("after provision --planner: %v", err)
	}
	if code, out, _ := runCLI(t, "provision", "--planner", "--nats", url); code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("second provision --planner: exit %d:\n%s", code, out)
	}
}
