// Command tollgate-bench is `make bench`: it measures Tollgate's
// throughput, latency and footprint next to raw JetStream references on
// fresh embedded nats-servers, prints the report and writes it as JSON and
// markdown. Parameters are BENCH_* environment variables (see
// internal/bench Config.FromEnv); flags override the most common ones.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate-dev/tollgate/internal/bench"
)

func main() {
	// The bench starts its raw-stage reference processes from this executable.
	bench.MaybeRunRawStage()
	os.Exit(run())
}

func run() int {
	cfg, err := bench.Defaults().FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
		return 2
	}
	fs := flag.NewFlagSet("tollgate-bench", flag.ContinueOnError)
	fs.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs per throughput figure (env BENCH_RUNS)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured window of a throughput run (env BENCH_DURATION)")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "turns in flight (env BENCH_CONCURRENCY)")
	fs.IntVar(&cfg.Pending, "pending", cfg.Pending, "approvals left pending in the footprint phase (env BENCH_PENDING)")
	fs.StringVar(&cfg.BinDir, "bin", cfg.BinDir, "directory of the tollgate binary, which runs the stages; empty builds it (env BENCH_BIN)")
	fs.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for the report files (env BENCH_OUT)")
	keep := fs.Bool("keep", false, "keep the work directory (servers' stores, stage logs)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	work, err := os.MkdirTemp("", "tollgate-bench-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
		return 1
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "tollgate-bench: work directory", work)
	} else {
		defer os.RemoveAll(work)
	}
	cfg.WorkDir = work
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
		return 1
	}
	r.Markdown(os.Stdout)
	if cfg.OutDir != "" {
		paths, err := r.WriteFiles(cfg.OutDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
			return 1
		}
		for _, p := range paths {
			fmt.Fprintln(os.Stderr, "tollgate-bench: wrote", p)
		}
	}
	if len(r.Errors) > 0 {
		return 1
	}
	return 0
}
