package main

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Streams and buckets an earlier version provisioned (no atomic publish):
// the dry run shows allow_atomic for each, and provision turns it on.
func TestProvisionTurnsOnAtomicPublish(t *testing.T) {
	url, js := provEmptyServer(t)
	if code, _, errOut := runCLI(t, "provision", "--nats", url); code != 0 {
		t.Fatalf("provision: %s", errOut)
	}
	cfg := topology.DefaultConfig()
	all := append(cfg.Streams(), cfg.BucketStreams()...)
	for _, sc := range all {
		sc.AllowAtomicPublish = false
		if _, err := js.UpdateStream(provCtx(t), sc); err != nil {
			t.Fatal(err)
		}
	}
	res := provisionJSON(t, "--nats", url, "--dry-run")
	if len(res.Changes) != len(all) {
		t.Fatalf("dry run: %d changes, want %d: %+v", len(res.Changes), len(all), res.Changes)
	}
	for _, ch := range res.Changes {
		if ch.Action != "update" || len(ch.Fields) != 1 || ch.Fields[0] != (topology.FieldDiff{Field: "allow_atomic", Have: "false", Want: "true"}) {
			t.Fatalf("dry run change %+v, want only allow_atomic false -> true", ch)
		}
	}
	code, out, _ := runCLI(t, "provision", "--nats", url, "--dry-run")
	if code != 0 || !strings.Contains(out, "update stream TOLLGATE_EVENTS\n    allow_atomic: false -> true\n") ||
		!strings.Contains(out, "update bucket tollgate_claims\n    allow_atomic: false -> true\n") {
		t.Fatalf("dry run text: exit %d:\n%s", code, out)
	}
	if s, err := js.Stream(provCtx(t), topology.StreamEvents); err != nil || s.CachedInfo().Config.AllowAtomicPublish {
		t.Fatalf("the dry run changed %s: %v", topology.StreamEvents, err)
	}
	if res := provisionJSON(t, "--nats", url); len(res.Changes) != len(all) {
		t.Fatalf("provision: %+v", res)
	}
	for _, sc := range all {
		if s, err := js.Stream(provCtx(t), sc.Name); err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("%s after provision: %v, allow_atomic off", sc.Name, err)
		}
	}
}
