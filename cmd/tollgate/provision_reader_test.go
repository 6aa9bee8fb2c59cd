package main

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
)

// provision --outcome-reader creates the named reader's pull consumers of
// the turn logs' outcome events, one per partition, filtered to them and
// starting after what the partition held; the dry run lists them first,
// and a second run finds nothing to change. A name that cannot be a
// durable is a usage error.
func TestProvisionOutcomeReaderCreatesItsConsumers(t *testing.T) {
	url, js := provEmptyServer(t)
	if code, _, errOut := runCLI(t, "provision", "--nats", url); code != 0 {
		t.Fatalf("provision: exit %d, stderr %q", code, errOut)
	}
	// A message already in partition 0 before the consumers exist: they
	// start after it.
	if _, err := js.Publish(provCtx(t), topology.TurnLogSubject(0, "t-before", "outcome"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	p := topology.DefaultTurnLogPartitions
	res := provisionJSON(t, "--nats", url, "--outcome-reader", "transport-cli", "--dry-run")
	if len(res.Changes) != p {
		t.Fatalf("dry run: %+v, want %d consumers to create", res.Changes, p)
	}
	for i, ch := range res.Changes {
		if want := topology.TurnLogStream(i) + "/" + outcomes.Durable("transport-cli", i); ch.Action != "create" || ch.Kind != topology.KindConsumer || ch.Name != want {
			t.Errorf("dry run change %d: %+v, want create consumer %s", i, ch, want)
		}
	}
	if _, err := js.Consumer(provCtx(t), topology.TurnLogStream(0), outcomes.Durable("transport-cli", 0)); err == nil {
		t.Fatal("the dry run created a consumer")
	}

	if code, out, errOut := runCLI(t, "provision", "--nats", url, "--outcome-reader", "transport-cli"); code != 0 || !strings.Contains(out, "create consumer "+topology.TurnLogStream(p-1)+"/"+outcomes.Durable("transport-cli", p-1)) {
		t.Fatalf("provision --outcome-reader: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	for i := range p {
		c, err := js.Consumer(provCtx(t), topology.TurnLogStream(i), outcomes.Durable("transport-cli", i))
		if err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
		cfg := c.CachedInfo().Config
		if cfg.FilterSubject != topology.TurnLogOutcomeFilter(i) || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy {
			t.Errorf("partition %d: consumer %+v", i, cfg)
		}
		wantStart := uint64(1)
		if i == 0 {
			wantStart = 2 // after the message already there
		}
		if cfg.OptStartSeq != wantStart {
			t.Errorf("partition %d: starts at %d, want %d", i, cfg.OptStartSeq, wantStart)
		}
	}
	if res := provisionJSON(t, "--nats", url, "--outcome-reader", "transport-cli"); len(res.Changes) != 0 {
		t.Fatalf("second run: %+v, want nothing to change", res.Changes)
	}
	if code, _, errOut := runCLI(t, "provision", "--nats", url, "--outcome-reader", "transport.cli"); code != 2 || !strings.Contains(errOut, "durable name prefix") {
		t.Fatalf("a dotted reader name: exit %d, stderr %q, want a usage error", code, errOut)
	}
}
