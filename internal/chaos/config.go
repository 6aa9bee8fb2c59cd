// Package chaos is Tollgate's chaos harness: it runs the stage binaries as
// separate processes (several replicas of each) against a real nats-server
// process, with a remote tool service (internal/chaos/toolsvc, several
// replicas in one queue group) among the tools, drives a seeded mix of
// turns through the documented protocol, SIGKILLs and restarts random
// workers (tool service replicas included) and the broker while it runs
// (and the stage that made a turn's k-th durable write, right after it,
// for every k of both paths: writekill.go),
// and then checks, from a ledger of every tool execution (in-process and
// remote), the KV records and the event streams, that no accepted turn was
// lost, no call ran twice or without its approval or under another turn's
// TurnContext, a remote call whose reply was lost is reported uncertain,
// and that each session ran its turns one batch at a time in arrival
// order. In planner mode (Config.Planner) part of the turns are text only
// and go through replicated planner processes, killed like the other
// workers, against a scripted model the harness serves; the checks then
// cover their step batches too, and add that no model step was asked
// again after its answer was recorded and that each completed planner
// turn's reply went out under its own context. Part of the approvals
// choose a session grant (DecideGrant), so later calls of the granted tool
// in that session are decided by the grant with no prompt, and some turns
// revoke their session's grants before their decision (TurnPlan.Revoke):
// a grant-decided call counts as approved only under an approve grant the
// requester made in its session before the decision, and one that ran
// after its grant was revoked or expired is a violation.
//
// Run it with `make chaos` (long form) or `go test ./internal/chaos` (short
// form, part of `make test`). See Config for the parameters and their
// environment variables; a run prints its seed and parameters first, and the
// same seed replays the same turn mix and fault schedule.
package chaos

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is one run's parameters. Zero values get the defaults of Defaults.
type Config struct {
	Seed           int64 // 0: derived from the clock (printed)
	Turns          int   // turns to drive
	Kills          int   // worker SIGKILLs (stage processes and tool service replicas, in turn)
	BrokerRestarts int   // nats-server SIGKILL + restart (in a cluster: of the node leading TOLLGATE_TURNS)
	// LeaderPauses (in a cluster only) SIGSTOP the node leading the
	// busiest stream for longer than an election, then SIGCONT it: a
	// leader that stops answering without dying, and comes back with a
	// stale view after another node led its streams (brokers.go).
	LeaderPauses int
	// Partitions (in a cluster only) cut the node leading the busiest
	// stream off from its peers (every route goes through a loopback proxy
	// of the harness: partition.go) for longer than an election, then
	// heal the cut.
	Partitions int
	// WriteKills SIGKILL the stage that made a turn's k-th durable write
	// right after it, going round every k of the plain and the approval
	// path (writekill.go); 0: none.
	WriteKills      int
	Replicas        int // processes per stage, and of the remote tool service
	Concurrency     int // sessions driven at once
	MaxSessionTurns int // a session has 1..MaxSessionTurns turns
	// ClusterNodes is how many nats-server processes run: 1, or a
	// JetStream cluster of 3 (or 5) on loopback, whose every node's URL
	// the stages and the harness are given.
	ClusterNodes int
	// StreamReplicas is the replica count of every stream and bucket (the
	// stages' TOLLGATE_REPLICAS); 0: ClusterNodes.
	StreamReplicas int
	// BurstPercent of a session's later turns are published right after the
	// previous one, without waiting for it to end (so they queue); negative
	// for none.
	BurstPercent int
	// ExpiresAfter is the approval lifetime of the ledger_expiring tool.
	ExpiresAfter time.Duration
	// ToolCrashes is how many calls of the remote tool service make it
	// exit after acting and before replying (CallPlan.Crash); negative for
	// none. They are sent once every fault has been injected and every
	// worker is up again (no broker restart can lose the request before
	// the service acts, no executor kill can turn the wait into a 2-minute
	// claim lease); each holds its session for the stages' tool timeout (1
	// minute) before the call is reported EXECUTION_UNCERTAIN. Keep it
	// below Concurrency.
	ToolCrashes int
	// ClaimLease and ToolTimeout, when set, are the stages' (--claim-lease,
	// --tool-timeout; the defaults are 2 minutes and 1 minute): a short
	// run shortens the waits a killed worker's claim and a crashed tool
	// service's call cause.
	ClaimLease, ToolTimeout time.Duration
	// Faults are spread over turns published in [FaultFrom, FaultTo) of Turns.
	FaultFrom, FaultTo float64
	// StallTimeout ends the drive when no turn is published or ends for
	// this long (it must exceed the 2-minute execution-claim lease plus
	// retry delays, or a call claimed by a killed worker looks lost).
	StallTimeout time.Duration
	// MaxDuration bounds the whole drive.
	MaxDuration time.Duration

	// Planner: PlannerPercent of the turns are text-only and go through
	// replicated planner processes (cmd/planner, killed like the other
	// workers) against a scripted model the harness serves
	// (pipeline/planner/plannertest), whose scripts propose tool calls
	// (gated ones included) and then a final answer.
	Planner        bool
	PlannerPercent int // default 30
	// KillOnly, if set, are the workers (binary names) kills pick from,
	// instead of every stage and the tool service.
	KillOnly []string

	BinDir       string // prebuilt binaries (tollgate, which runs every stage, and nats-server); empty: build
	RaceBinaries bool   // build the stage binaries with -race
	WorkDir      string // logs, ledger, JetStream store; must exist
	Logf         func(format string, args ...any)
}

// Defaults are the long form's parameters (`make chaos`).
func Defaults() Config {
	return Config{
		Turns: 5000, Kills: 50, BrokerRestarts: 2, WriteKills: writeKillPositions(), Replicas: 2, Concurrency: 32,
		MaxSessionTurns: 6, BurstPercent: 40, ExpiresAfter: 2 * time.Second, ToolCrashes: 5,
		FaultFrom: 0.05, FaultTo: 0.9,
		StallTimeout: 4 * time.Minute, MaxDuration: 60 * time.Minute,
	}
}

// withDefaults fills zero fields from Defaults.
func (c Config) withDefaults() Config {
	d := Defaults()
	setInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	setInt(&c.Turns, d.Turns)
	setInt(&c.Replicas, d.Replicas)
	setInt(&c.Concurrency, d.Concurrency)
	setInt(&c.MaxSessionTurns, d.MaxSessionTurns)
	setInt(&c.ClusterNodes, 1)
	setInt(&c.StreamReplicas, c.ClusterNodes)
	if c.Kills < 0 {
		c.Kills = 0
	}
	if c.BrokerRestarts < 0 {
		c.BrokerRestarts = 0
	}
	if c.WriteKills < 0 {
		c.WriteKills = 0
	}
	if c.LeaderPauses < 0 || !c.Clustered() {
		c.LeaderPauses = 0
	}
	if c.Partitions < 0 || !c.Clustered() {
		c.Partitions = 0
	}
	switch {
	case c.BurstPercent == 0:
		c.BurstPercent = d.BurstPercent
	case c.BurstPercent < 0: // no bursts
		c.BurstPercent = 0
	}
	switch {
	case c.ToolCrashes == 0:
		c.ToolCrashes = d.ToolCrashes
	case c.ToolCrashes < 0: // none
		c.ToolCrashes = 0
	}
	if c.PlannerPercent <= 0 {
		c.PlannerPercent = 30
	}
	if c.ExpiresAfter <= 0 {
		c.ExpiresAfter = d.ExpiresAfter
	}
	if c.FaultTo <= 0 || c.FaultTo > 1 || c.FaultFrom < 0 || c.FaultFrom >= c.FaultTo {
		c.FaultFrom, c.FaultTo = d.FaultFrom, d.FaultTo
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = d.StallTimeout
	}
	if c.MaxDuration <= 0 {
		c.MaxDuration = d.MaxDuration
	}
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano() % 1_000_000_000
	}
	if c.Logf == nil {
		c.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	return c
}

// Params is the one-line description of a run that replays it.
func (c Config) Params() string {
	planner := "off"
	if c.Planner {
		planner = fmt.Sprintf("%d%%", c.PlannerPercent)
	}
	if len(c.KillOnly) > 0 {
		planner += " kill_only=" + strings.Join(c.KillOnly, ",")
	}
	return fmt.Sprintf("seed=%d turns=%d kills=%d broker_restarts=%d write_kills=%d leader_pauses=%d partitions=%d replicas=%d cluster_nodes=%d stream_replicas=%d concurrency=%d max_session_turns=%d burst=%d%% expires_after=%v tool_crashes=%d faults_in=[%.2f,%.2f) stall_timeout=%v race_binaries=%v planner=%s",
		c.Seed, c.Turns, c.Kills, c.BrokerRestarts, c.WriteKills, c.LeaderPauses, c.Partitions, c.Replicas, c.ClusterNodes, c.StreamReplicas, c.Concurrency, c.MaxSessionTurns, c.BurstPercent,
		c.ExpiresAfter, c.ToolCrashes, c.FaultFrom, c.FaultTo, c.StallTimeout, c.RaceBinaries, planner)
}

// Clustered reports whether the run uses a nats-server cluster.
func (c Config) Clustered() bool { return c.ClusterNodes > 1 }

// Replay is the command line that replays a run.
func (c Config) Replay() string {
	s := fmt.Sprintf("make chaos CHAOS_SEED=%d CHAOS_TURNS=%d CHAOS_KILLS=%d CHAOS_RESTARTS=%d CHAOS_WRITE_KILLS=%d CHAOS_REPLICAS=%d",
		c.Seed, c.Turns, c.Kills, c.BrokerRestarts, c.WriteKills, c.Replicas)
	if c.Clustered() {
		s += fmt.Sprintf(" CHAOS_CLUSTER=%d CHAOS_STREAM_REPLICAS=%d CHAOS_LEADER_PAUSES=%d CHAOS_PARTITIONS=%d", c.ClusterNodes, c.StreamReplicas, c.LeaderPauses, c.Partitions)
	}
	if c.Planner {
		s += fmt.Sprintf(" CHAOS_PLANNER=1 CHAOS_PLANNER_PERCENT=%d", c.PlannerPercent)
	}
	return s
}

// FromEnv overrides c with the TOLLGATE_CHAOS_* variables that are set:
// SEED, TURNS, KILLS, RESTARTS, WRITE_KILLS, REPLICAS, CLUSTER, STREAM_REPLICAS,
// CONCURRENCY, MAX_SESSION_TURNS, BURST_PERCENT, EXPIRES_AFTER,
// TOOL_CRASHES, STALL_TIMEOUT, MAX_DURATION, BIN, RACE (1), PLANNER (1),
// PLANNER_PERCENT.
func (c Config) FromEnv() (Config, error) {
	var err error
	num := func(name string, v *int) {
		if s, ok := os.LookupEnv("TOLLGATE_CHAOS_" + name); ok && s != "" && err == nil {
			*v, err = strconv.Atoi(s)
			if err != nil {
				err = fmt.Errorf("TOLLGATE_CHAOS_%s: %w", name, err)
			}
		}
	}
	dur := func(name string, v *time.Duration) {
		if s, ok := os.LookupEnv("TOLLGATE_CHAOS_" + name); ok && s != "" && err == nil {
			*v, err = time.ParseDuration(s)
			if err != nil {
				err = fmt.Errorf("TOLLGATE_CHAOS_%s: %w", name, err)
			}
		}
	}
	if s := os.Getenv("TOLLGATE_CHAOS_SEED"); s != "" {
		if c.Seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			return c, fmt.Errorf("TOLLGATE_CHAOS_SEED: %w", err)
		}
	}
	num("TURNS", &c.Turns)
	num("KILLS", &c.Kills)
	num("RESTARTS", &c.BrokerRestarts)
	num("LEADER_PAUSES", &c.LeaderPauses)
	num("PARTITIONS", &c.Partitions)
	num("WRITE_KILLS", &c.WriteKills)
	num("REPLICAS", &c.Replicas)
	num("CLUSTER", &c.ClusterNodes)
	num("STREAM_REPLICAS", &c.StreamReplicas)
	num("CONCURRENCY", &c.Concurrency)
	num("MAX_SESSION_TURNS", &c.MaxSessionTurns)
	num("BURST_PERCENT", &c.BurstPercent)
	num("TOOL_CRASHES", &c.ToolCrashes)
	num("PLANNER_PERCENT", &c.PlannerPercent)
	dur("EXPIRES_AFTER", &c.ExpiresAfter)
	dur("STALL_TIMEOUT", &c.StallTimeout)
	dur("MAX_DURATION", &c.MaxDuration)
	if s := os.Getenv("TOLLGATE_CHAOS_BIN"); s != "" {
		c.BinDir = s
	}
	if os.Getenv("TOLLGATE_CHAOS_RACE") == "1" {
		c.RaceBinaries = true
	}
	if os.Getenv("TOLLGATE_CHAOS_PLANNER") == "1" {
		c.Planner = true
	}
	return c, err
}
