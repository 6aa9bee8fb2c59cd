package main

import (
	"slices"
	"strconv"
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
		if !slices.Equal(cfg.FilterSubjects, []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i)}) ||
			cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy {
			t.Errorf("partition %d: consumer %+v, want the outcome and awaiting events", i, cfg)
		}
		wantStart := uint64(1)
		if i == 0 {
			wantStart = 2 // after the message already there
		}
		if cfg.OptStartSeq != wantStart || cfg.Metadata[outcomes.RequestsFromKey] != strconv.FormatUint(wantStart, 10) {
			t.Errorf("partition %d: starts at %d, requests from %q; want %d for both", i, cfg.OptStartSeq, cfg.Metadata[outcomes.RequestsFromKey], wantStart)
		}
	}
	if res := provisionJSON(t, "--nats", url, "--outcome-reader", "transport-cli"); len(res.Changes) != 0 {
		t.Fatalf("second run: %+v, want nothing to change", res.Changes)
	}

	// A reader's consumer an earlier version made for the outcome events
	// only is listed, then made to follow the awaiting events too, where
	// it is.
	old, err := js.CreateConsumer(provCtx(t), topology.TurnLogStream(0), jetstream.ConsumerConfig{
		Durable: outcomes.Durable("earlier", 0), FilterSubject: topology.TurnLogOutcomeFilter(0),
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	name := topology.TurnLogStream(0) + "/" + old.CachedInfo().Name
	dry := provisionJSON(t, "--nats", url, "--outcome-reader", "earlier", "--dry-run")
	if !slices.ContainsFunc(dry.Changes, func(c provisionChange) bool {
		return c.Action == "update" && c.Name == name && len(c.Fields) == 1 && c.Fields[0].Field == "filter_subjects" &&
			c.Fields[0].Want == topology.TurnLogOutcomeFilter(0)+" "+topology.TurnLogAwaitingFilter(0)
	}) {
		t.Fatalf("dry run: %+v, want %s updated (filter_subjects)", dry.Changes, name)
	}
	provisionJSON(t, "--nats", url, "--outcome-reader", "earlier")
	c, err := js.Consumer(provCtx(t), topology.TurnLogStream(0), outcomes.Durable("earlier", 0))
	if err != nil {
		t.Fatal(err)
	}
	if cfg := c.CachedInfo().Config; !outcomes.FollowsRequests(cfg) || cfg.OptStartSeq != 1 || cfg.Metadata[outcomes.RequestsFromKey] == "" {
		t.Fatalf("the earlier consumer after provisioning: %+v, want it following the awaiting events, from where it started", cfg)
	}
	if code, _, errOut := runCLI(t, "provision", "--nats", url, "--outcome-reader", "transport.cli"); code != 2 || !strings.Contains(errOut, "durable name prefix") {
		t.Fatalf("a dotted reader name: exit %d, stderr %q, want a usage error", code, errOut)
	}
}
