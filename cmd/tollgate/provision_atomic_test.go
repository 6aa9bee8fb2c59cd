package main

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Streams and buckets an earlier version provisioned for its group
// committer (since removed) allow atomic batch publish: the dry run lists
// nothing to change, provision finds them up to date and leaves the
// setting as it is.
func TestProvisionLeavesAtomicPublishAlone(t *testing.T) {
	url, js := provEmptyServer(t)
	if code, _, errOut := runCLI(t, "provision", "--nats", url); code != 0 {
		t.Fatalf("provision: %s", errOut)
	}
	cfg := topology.DefaultConfig()
	all := append(cfg.Streams(), cfg.BucketStreams()...)
	for _, sc := range all {
		sc.AllowAtomicPublish = true
		if _, err := js.UpdateStream(provCtx(t), sc); err != nil {
			t.Fatal(err)
		}
	}
	if res := provisionJSON(t, "--nats", url, "--dry-run"); len(res.Changes) != 0 {
		t.Fatalf("dry run: %+v, want no change", res.Changes)
	}
	if code, out, _ := runCLI(t, "provision", "--nats", url); code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("provision: exit %d:\n%s", code, out)
	}
	for _, sc := range all {
		if s, err := js.Stream(provCtx(t), sc.Name); err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("%s after provision: %v, allow_atomic turned off", sc.Name, err)
		}
	}
}
