package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// provEmptyServer is a JetStream server with nothing on it, and a client.
func provEmptyServer(t *testing.T) (url string, js jetstream.JetStream) {
	t.Helper()
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return ns.ClientURL(), js
}

// provEverything is every stream, bucket and consumer provision makes, as
// "<kind> <name>", in the order provision lists them (the turn-log
// streams after the buckets).
func provEverything() []string {
	cfg := topology.DefaultConfig()
	var out []string
	for _, s := range cfg.Streams() {
		out = append(out, "stream "+s.Name)
	}
	for _, b := range cfg.Buckets() {
		out = append(out, "bucket "+b.Bucket)
	}
	for _, s := range cfg.TurnLogStreams() {
		out = append(out, "stream "+s.Name)
	}
	for _, c := range tollgate.StageConsumers() {
		out = append(out, "consumer "+c.Stream+"/"+c.Config.Durable)
	}
	return out
}

func provisionJSON(t *testing.T, args ...string) provisionResult {
	t.Helper()
	code, out, errOut := runCLI(t, append([]string{"provision", "--json"}, args...)...)
	var res provisionResult
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil {
		t.Fatalf("provision %v: exit %d, %v, stderr %q:\n%s", args, code, err, errOut, out)
	}
	return res
}

func provCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// provision on an empty server creates every stream, bucket and stage
// consumer, after which the stages' check passes; run again, it finds
// nothing to change.
func TestProvisionCreatesEverything(t *testing.T) {
	url, js := provEmptyServer(t)
	code, out, errOut := runCLI(t, "provision", "--nats", url)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, w := range provEverything() {
		if !strings.Contains(out, "create "+w+"\n") {
			t.Errorf("output does not list create %s:\n%s", w, out)
		}
	}
	if err := topology.Check(provCtx(t), js, topology.DefaultConfig(), tollgate.StageConsumers()); err != nil {
		t.Fatalf("after provision: %v", err)
	}
	code, out, _ = runCLI(t, "provision", "--nats", url)
	if code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("second provision: exit %d:\n%s", code, out)
	}
}

// --dry-run on an empty server lists everything as to be created and
// creates nothing.
func TestProvisionDryRunOnAnEmptyServerChangesNothing(t *testing.T) {
	url, js := provEmptyServer(t)
	res := provisionJSON(t, "--nats", url, "--dry-run")
	var got []string
	for _, c := range res.Changes {
		if c.Action != "create" {
			t.Errorf("%s %s %s on an empty server, want create", c.Action, c.Kind, c.Name)
		}
		got = append(got, c.Kind+" "+c.Name)
	}
	if strings.Join(got, "\n") != strings.Join(provEverything(), "\n") || !res.DryRun {
		t.Fatalf("dry run lists:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(provEverything(), "\n"))
	}
	names := js.StreamNames(provCtx(t))
	for name := range names.Name() {
		t.Errorf("dry run created stream %s", name)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

// After a setting changed on the server, --dry-run shows that field's
// value there and the one wanted, and leaves it; provision then fixes it.
func TestProvisionDryRunShowsAChangedSetting(t *testing.T) {
	url, js := provEmptyServer(t)
	if code, _, errOut := runCLI(t, "provision", "--nats", url); code != 0 {
		t.Fatalf("provision: %s", errOut)
	}
	drifted := topology.DefaultConfig().BucketStreams()[2] // tollgate_sessions
	drifted.MaxMsgsPerSubject = 7
	if _, err := js.UpdateStream(provCtx(t), drifted); err != nil {
		t.Fatal(err)
	}
	res := provisionJSON(t, "--nats", url, "--dry-run")
	want := provisionChange{Action: "update", Kind: topology.KindBucket, Name: topology.BucketSessions, Fields: []topology.FieldDiff{{Field: "history", Have: "7", Want: "1"}}}
	if len(res.Changes) != 1 || res.Changes[0].Action != want.Action || res.Changes[0].Name != want.Name ||
		len(res.Changes[0].Fields) != 1 || res.Changes[0].Fields[0] != want.Fields[0] {
		t.Fatalf("dry run after a change: %+v, want [%+v]", res.Changes, want)
	}
	code, out, _ := runCLI(t, "provision", "--nats", url, "--dry-run")
	if code != 0 || !strings.Contains(out, "update bucket tollgate_sessions\n    history: 7 -> 1\n") {
		t.Fatalf("dry run text: exit %d:\n%s", code, out)
	}
	kv, err := js.KeyValue(provCtx(t), topology.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(provCtx(t)); err != nil || st.History() != 7 {
		t.Fatalf("dry run changed the bucket: %v, %v", st, err)
	}
	if res := provisionJSON(t, "--nats", url); len(res.Changes) != 1 || res.DryRun {
		t.Fatalf("provision: %+v", res)
	}
	if st, err := kv.Status(provCtx(t)); err != nil || st.History() != 1 {
		t.Fatalf("provision left the bucket's history at %v (%v), want 1", st.History(), err)
	}
}
