// Package bench is Tollgate's benchmark harness (`make bench`): it measures,
// on fresh embedded nats-servers (file storage, loopback), raw JetStream
// references and Tollgate's turns per second end to end through all four
// stages, in one process and as separate stage processes, with latencies,
// the memory and KV footprint of pending approvals, recovery after a
// redriver restart, an approval turn whose approved call is a NATS tool
// service next to the built-in one, the approval turn submitted and
// decided over the HTTP gateway next to NATS, and a planner turn (a
// scripted model: one tool call, then the answer) next to the plain turns,
// and prints a report (also written as JSON and markdown).
//
// The main reference is the raw turn: a minimal program (rawStages) that
// performs the same JetStream operations, in the same order and with
// payloads of the same sizes, as one Tollgate turn (rawseq.go), traced from
// the real stages at the start of every run (trace.go). Efficiency is
// Tollgate's rate divided by the raw turn's, measured in the same run on
// the same machine, which is what makes numbers from a noisy shared
// machine comparable.
package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is one bench run's parameters; see FromEnv for the variables.
type Config struct {
	Runs     int           // runs per throughput figure (median, min-max)
	Duration time.Duration // measured window of a throughput run
	Warmup   time.Duration // before the window
	// MinTurns, if above 0, keeps a throughput window open past Duration
	// until that many turns ended in it (at most 30 s longer), the rate
	// being taken over the window's real length. The smoke tests set it:
	// they check that every figure is produced, and a loaded machine can
	// end a tiny fixed window before any turn did. `make bench` leaves it
	// 0: fixed windows.
	MinTurns    int
	Concurrency int // turns in flight (closed loop); also the raw turn's
	// ConsumeMsgs is how many messages the pull-consume reference reads.
	ConsumeMsgs int
	// LowRate is the "low load" of the latency runs (turns/s); the other
	// load is 80% of the measured peak.
	LowRate         float64
	LatencyDuration time.Duration
	// Pending is how many approvals the footprint phase leaves pending
	// (and then decides, for the recovery time), and how many the inbox
	// phase lists from.
	Pending int
	// Phases to run: throughput, latency, footprint, sync (the throughput
	// figures again with sync_interval: always), procs (the separate
	// stage processes in throughput and latency), toolservice (the
	// approval path with its approved call built in and behind a NATS
	// tool service, side by side), profile (CPU and allocation profiles
	// of the all-in-one runs into ProfileDir), gateway (the approval
	// turn over NATS and over the HTTP gateway, side by side), planner (a
	// planner turn against a scripted model next to the fast and approval
	// turns), inbox (the web inbox's first page with Pending approvals
	// pending: time and HTML size), approvals (GET /v1/approvals of a
	// `tollgate gateway` process with Pending approvals pending, paged
	// through by 16 clients at once: page time and the gateway's
	// resident memory), cluster (not in AllPhases: the throughput figures again on a
	// three-node cluster on loopback with R3 streams and buckets, both
	// sync settings; `make bench-cluster`), layout (not in AllPhases: the
	// raw turn in other storage layouts, both sync settings; layout.go).
	Phases map[string]bool
	// Layouts are the layout phase's raw-turn layouts (layoutKinds'
	// names), and LayoutPartitions the partition counts P at which it
	// measures the two one-write-per-fact designs (layout.go).
	Layouts          []string
	LayoutPartitions []int

	// ToolDir is where the tools' sandboxes go (write_file's files, the
	// bench tool service's): a directory of its own below it per server
	// started. The bench measures orchestration, as the peers' benchmarks
	// do (their tool is a digest of its arguments, and writes nothing), and
	// a deployment keeps its JetStream store on a volume of its own. Put
	// beside the store, a tool's file writes join the store's disk
	// flushes: with sync_interval: always each fsync's journal commit
	// waits on the tool's data (ext4's ordered mode), and measured with
	// the approval turn at 200 in flight that cost 0.6-1.3 CPU ms per
	// turn and about a quarter of the turns per second (docs/bench.md,
	// "The tool's files off the store's disk"). The default is a memory file system
	// (defaultToolDir); ToolDirStore keeps them beside the store.
	ToolDir string

	BinDir   string // the tollgate binary, which runs each stage; empty: built into WorkDir
	OutDir   string // report files; empty: none
	WorkDir  string // servers' stores, logs, binaries; must exist
	LogLevel string // the stages' log level
	// ProfileDir receives cpu-<path>.pprof and allocs-<path>.pprof of the
	// all-in-one runs when the profile phase is on, and, whenever it is
	// set, cpu-latency-<path>-<rate>.pprof and heap-latency-<path>-<rate>.pprof
	// of each all-in-one open loop of the latency phase (the heap: what the
	// loop left live at its end).
	ProfileDir string
	Logf       func(format string, args ...any)
}

// ToolDirStore is the ToolDir that keeps the tools' sandboxes beside the
// store, in the server's own directory.
const ToolDirStore = "store"

// defaultToolDir is /dev/shm, a memory file system on Linux, where it is
// a directory; else ToolDirStore.
func defaultToolDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ToolDirStore
}

// AllPhases is every phase but profile.
var AllPhases = []string{"throughput", "procs", "latency", "footprint", "sync", "toolservice", "gateway", "planner", "inbox", "approvals"}

// Defaults are `make bench`'s parameters (about 10 minutes on 2 cores).
func Defaults() Config {
	c := Config{
		Runs: 3, Duration: 4 * time.Second, Warmup: time.Second, Concurrency: 32,
		ConsumeMsgs: 50000, LowRate: 50, LatencyDuration: 8 * time.Second, Pending: 10000,
		Phases: map[string]bool{}, LogLevel: "info",
		Layouts: []string{"today", "records", "events"}, LayoutPartitions: []int{1, 4},
		ToolDir: defaultToolDir(),
	}
	for _, p := range AllPhases {
		c.Phases[p] = true
	}
	return c
}

// FromEnv overrides c with the BENCH_* variables that are set: RUNS,
// DURATION, WARMUP, CONCURRENCY, CONSUME_MSGS, LOW_RATE, LAT_DURATION,
// PENDING, PHASES (comma-separated), BIN, OUT, LOG_LEVEL, PROFILE (a
// directory; adds the profile phase), LAYOUTS and LAYOUT_PARTITIONS
// (comma-separated), TOOL_DIR (a directory, or "store").
func (c Config) FromEnv() (Config, error) {
	var err error
	get := func(name string) (string, bool) {
		v, ok := os.LookupEnv("BENCH_" + name)
		return v, ok && v != "" && err == nil
	}
	num := func(name string, v *int) {
		if s, ok := get(name); ok {
			if *v, err = strconv.Atoi(s); err != nil {
				err = fmt.Errorf("BENCH_%s: %w", name, err)
			}
		}
	}
	dur := func(name string, v *time.Duration) {
		if s, ok := get(name); ok {
			if *v, err = time.ParseDuration(s); err != nil {
				err = fmt.Errorf("BENCH_%s: %w", name, err)
			}
		}
	}
	num("RUNS", &c.Runs)
	dur("DURATION", &c.Duration)
	dur("WARMUP", &c.Warmup)
	num("CONCURRENCY", &c.Concurrency)
	num("CONSUME_MSGS", &c.ConsumeMsgs)
	dur("LAT_DURATION", &c.LatencyDuration)
	num("PENDING", &c.Pending)
	if s, ok := get("LOW_RATE"); ok {
		if c.LowRate, err = strconv.ParseFloat(s, 64); err != nil {
			err = fmt.Errorf("BENCH_LOW_RATE: %w", err)
		}
	}
	if s, ok := get("PHASES"); ok {
		c.Phases = map[string]bool{}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.Phases[p] = true
			}
		}
	}
	if s, ok := get("LAYOUTS"); ok {
		c.Layouts = nil
		for _, l := range strings.Split(s, ",") {
			if l = strings.TrimSpace(l); l != "" {
				c.Layouts = append(c.Layouts, l)
			}
		}
	}
	if s, ok := get("LAYOUT_PARTITIONS"); ok {
		c.LayoutPartitions = nil
		for _, f := range strings.Split(s, ",") {
			n, perr := strconv.Atoi(strings.TrimSpace(f))
			if perr != nil || n < 1 {
				err = fmt.Errorf("BENCH_LAYOUT_PARTITIONS: %q is not a positive count", f)
				break
			}
			c.LayoutPartitions = append(c.LayoutPartitions, n)
		}
	}
	if s, ok := get("BIN"); ok {
		c.BinDir = s
	}
	if s, ok := get("OUT"); ok {
		c.OutDir = s
	}
	if s, ok := get("TOOL_DIR"); ok {
		c.ToolDir = s
	}
	if s, ok := get("LOG_LEVEL"); ok {
		c.LogLevel = s
	}
	if s, ok := get("PROFILE"); ok {
		c.ProfileDir = s
		c.Phases["profile"] = true
	}
	return c, err
}

// validate reports parameters the harness cannot run with.
func (c Config) validate() error {
	switch {
	case c.Runs < 1 || c.Concurrency < 1 || c.ConsumeMsgs < 1 || c.Pending < 1:
		return fmt.Errorf("bench: runs, concurrency, consume messages and pending must be positive")
	case c.Duration <= 0 || c.Warmup < 0 || c.LatencyDuration <= 0 || c.LowRate <= 0:
		return fmt.Errorf("bench: durations and the low rate must be positive")
	case c.WorkDir == "":
		return fmt.Errorf("bench: WorkDir is required")
	case c.ToolDir == "":
		return fmt.Errorf("bench: ToolDir is required (a directory, or %q)", ToolDirStore)
	case c.Phases["profile"] && c.ProfileDir == "":
		return fmt.Errorf("bench: the profile phase needs a ProfileDir")
	}
	for _, l := range c.Layouts {
		if _, ok := layoutKinds[l]; !ok {
			return fmt.Errorf("bench: unknown layout %q (want today, state, records, events)", l)
		}
	}
	if c.Phases[phaseLayout] && (len(c.Layouts) == 0 || len(c.LayoutPartitions) == 0) {
		return fmt.Errorf("bench: the layout phase needs layouts and partition counts")
	}
	for p := range c.Phases {
		if p != "profile" && p != "cluster" && p != phaseLayout && !strings.Contains(","+strings.Join(AllPhases, ",")+",", ","+p+",") {
			return fmt.Errorf("bench: unknown phase %q (want %s, profile, cluster, layout)", p, strings.Join(AllPhases, ", "))
		}
	}
	return nil
}

// Params is the one-line description of the parameters.
func (c Config) Params() string {
	var ph []string
	for _, p := range append(AllPhases, "profile", "cluster", phaseLayout) {
		if c.Phases[p] {
			ph = append(ph, p)
		}
	}
	layouts := ""
	if c.Phases[phaseLayout] {
		layouts = fmt.Sprintf(" layouts=%s partitions=%s", strings.Join(c.Layouts, ","), strings.Trim(strings.Join(strings.Fields(fmt.Sprint(c.LayoutPartitions)), ","), "[]"))
	}
	return fmt.Sprintf("runs=%d duration=%v warmup=%v concurrency=%d consume_msgs=%d low_rate=%g/s lat_duration=%v pending=%d log_level=%s tool_dir=%s phases=%s%s",
		c.Runs, c.Duration, c.Warmup, c.Concurrency, c.ConsumeMsgs, c.LowRate, c.LatencyDuration, c.Pending, c.LogLevel, c.ToolDir, strings.Join(ph, ","), layouts)
}
