package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
)

var provisionCmd = &command{
	name:    "provision",
	summary: "create or update every stream, bucket and stage consumer (as an admin user); --dry-run shows the differences",
	example: "tollgate provision --creds admin.creds --replicas 3 --dry-run",
	run:     cmdProvision,
}

// provisionResult is what provision prints with --json.
type provisionResult struct {
	DryRun  bool              `json:"dry_run"`
	Changes []provisionChange `json:"changes"`
}

type provisionChange struct {
	Action string               `json:"action"` // "create" or "update"
	Kind   string               `json:"kind"`
	Name   string               `json:"name"`
	Fields []topology.FieldDiff `json:"fields,omitempty"`
}

// cmdProvision compares the topology (topology.Plan: the streams and
// buckets of topology.Config, the four stages' consumers as their runners
// create them) with the server, prints each difference, and unless
// --dry-run makes them: topology.Ensure, then topology.EnsureConsumer for
// each consumer. It then checks that nothing differs any more. With
// --planner it also creates the planner's bucket (topology.EnsurePlannerBucket)
// and consumers, and ingest's consumer of the step batches; with
// --outcome-reader NAME, NAME's pull consumers of the turn logs' awaiting
// and outcome events (outcomes.EnsureConsumers), created once and then
// left as they are (one an earlier version made for the outcome events
// only is made to follow the awaiting events too). Stages started with --no-provision need this to have run.
func cmdProvision(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, time.Minute)
	var replicas int
	scaffold.IntVar(fs, &replicas, "replicas", "TOLLGATE_REPLICAS", 1, "replicas for streams and buckets, as the stages run with (env TOLLGATE_REPLICAS)")
	dryRun := fs.Bool("dry-run", false, "print what would be created and what differs, field by field; change nothing")
	withPlanner := fs.Bool("planner", false, "also the planner's bucket and consumers and ingest's consumer of its step batches (docs/planner.md), so that the planner's user needs no right to create them")
	var readers []string
	fs.Func("outcome-reader", "also a reader's pull consumers of the turn logs' awaiting and outcome events (its requests and outcomes), `NAME`-outcome-<i> on each TOLLGATE_TURNLOG_<i> (docs/protocol.md 4.2a), for a transport whose user may only pull them (deploy/nats: transport-cli); repeatable", func(v string) error {
		if err := outcomes.CheckPrefix(v); err != nil {
			return err
		}
		readers = append(readers, v)
		return nil
	})
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 {
		return cmd.usageError("no arguments expected, got %q", pos)
	}
	topo := topology.DefaultConfig()
	topo.Replicas = replicas
	if err := topo.Validate(); err != nil {
		return cmd.usageError("%v", err)
	}
	if err := c.connect(); err != nil {
		return c.fail("provision", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	stages := tollgate.AllStages()
	if *withPlanner {
		stages = append(stages, tollgate.StagePlanner)
	}
	consumers := tollgate.StageConsumers(stages...)
	if *withPlanner {
		consumers = append(consumers, tollgate.IngestPlanConsumer()) // ingest --plan's step batches
	}
	changes, err := topology.Plan(ctx, c.js, topo, consumers)
	if err != nil {
		return c.fail("provision", err)
	}
	if *withPlanner {
		if _, err := c.js.KeyValue(ctx, topology.BucketPlanner); errors.Is(err, jetstream.ErrBucketNotFound) {
			changes = append(changes, topology.Change{Kind: topology.KindBucket, Name: topology.BucketPlanner, Missing: true})
		} else if err != nil {
			return c.fail("provision", err)
		}
	}
	for _, prefix := range readers {
		for i := range topo.TurnLogPartitionCount() {
			name := outcomes.Durable(prefix, i)
			cons, err := c.js.Consumer(ctx, topology.TurnLogStream(i), name)
			switch {
			case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
				changes = append(changes, topology.Change{Kind: topology.KindConsumer, Name: topology.TurnLogStream(i) + "/" + name, Missing: true})
			case err != nil:
				return c.fail("provision", fmt.Errorf("consumer %s: %w", name, err))
			case !outcomes.FollowsRequests(cons.CachedInfo().Config):
				// One an earlier version made for the outcome events only:
				// it follows the awaiting events too from now on.
				have := cons.CachedInfo().Config
				changes = append(changes, topology.Change{Kind: topology.KindConsumer, Name: topology.TurnLogStream(i) + "/" + name, Fields: []topology.FieldDiff{{
					Field: "filter_subjects", Have: strings.Join(append([]string{have.FilterSubject}, have.FilterSubjects...), " "),
					Want: topology.TurnLogOutcomeFilter(i) + " " + topology.TurnLogAwaitingFilter(i),
				}}})
			}
		}
	}
	res := provisionResult{DryRun: *dryRun, Changes: []provisionChange{}}
	for _, ch := range changes {
		pc := provisionChange{Action: "update", Kind: ch.Kind, Name: ch.Name, Fields: ch.Fields}
		if ch.Missing {
			pc.Action = "create"
		}
		res.Changes = append(res.Changes, pc)
	}
	if !*dryRun && len(changes) > 0 {
		if err := topology.Ensure(ctx, c.js, topo); err != nil {
			return c.fail("provision", err)
		}
		for _, spec := range consumers {
			if _, err := topology.EnsureConsumer(ctx, c.js, spec); err != nil {
				return c.fail("provision", fmt.Errorf("consumer %s/%s: %w", spec.Stream, spec.Config.Durable, err))
			}
		}
		if err := topology.Check(ctx, c.js, topo, consumers); err != nil {
			return c.fail("provision", err)
		}
	}
	if !*dryRun && *withPlanner {
		if _, err := topology.EnsurePlannerBucket(ctx, c.js, topo); err != nil {
			return c.fail("provision", err)
		}
	}
	if !*dryRun {
		// After the topology, which creates the turn logs they are on.
		for _, prefix := range readers {
			if _, err := outcomes.EnsureConsumers(ctx, c.js, prefix); err != nil {
				return c.fail("provision", err)
			}
		}
	}
	if c.json {
		printJSON(res)
		return 0
	}
	for _, ch := range res.Changes {
		fmt.Printf("%s %s %s\n", ch.Action, ch.Kind, ch.Name)
		for _, f := range ch.Fields {
			fmt.Printf("    %s: %s -> %s\n", f.Field, f.Have, f.Want)
		}
	}
	switch {
	case len(changes) == 0:
		fmt.Println("topology up to date: nothing to change")
	case *dryRun:
		fmt.Printf("dry run: %d to change, nothing changed\n", len(changes))
	default:
		fmt.Printf("provisioned: %d changed\n", len(changes))
	}
	return 0
}
