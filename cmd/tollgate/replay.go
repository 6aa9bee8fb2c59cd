package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
)

var replayCmd = &command{
	name:    "replay",
	summary: "re-read the streams over a range of turns: report what KV lacks, --rebuild it, or --dry-run a redrive",
	example: "tollgate replay --since 2h --dry-run",
	run:     cmdReplay,
}

// cmdReplay re-reads the streams over a range of turns and reports, rebuilds
// (--rebuild) or shadow-redrives (--dry-run) their KV records; see
// pipeline/replay and docs/operations.md.
func cmdReplay(cmd *command, args []string) int { return runReplay(cmd, args, os.Stdout) }

func runReplay(cmd *command, args []string, out io.Writer) int {
	fs := cmd.flags()
	var c client
	c.register(fs, 10*time.Minute) // reading a month of history can take a while
	var r replay.Range
	since := fs.String("since", "", "only turns accepted at or after this time: RFC 3339, or a duration ago (2h)")
	until := fs.String("until", "", "only turns accepted at or before this time: RFC 3339, or a duration ago")
	fs.Uint64Var(&r.FromSeq, "from-seq", 0, "only turns whose accepted message is at or after this TOLLGATE_TURNS sequence")
	fs.Uint64Var(&r.ToSeq, "to-seq", 0, "only turns whose accepted message is at or before this TOLLGATE_TURNS sequence")
	rebuild := fs.Bool("rebuild", false, "write the approval, batch and missing session records the streams prove and KV lacks (create / compare-and-set only; a batch kept in its turn's log is never written)")
	dryRun := fs.Bool("dry-run", false, "shadow redrive: report what each batch would do (started, deferred, failed) without running or publishing anything")
	policyPath := fs.String("policy", scaffold.Env("TOLLGATE_POLICY", ""), "policy JSON the stages run with, for --dry-run and to judge again decisions no stream keeps; empty for the built-in policy (env TOLLGATE_POLICY)")
	sealKeys := fs.String("seal-keys", "", "TurnContext seal key file, for --dry-run and to judge again decisions no stream keeps (default: env TOLLGATE_SEAL_KEYS, TOLLGATE_SEAL_KEY_FILE, else the dev key in $TOLLGATE_DATA or ./.tollgate)")
	var replicas int
	scaffold.IntVar(fs, &replicas, "replicas", "TOLLGATE_REPLICAS", 1, "replicas of a bucket --rebuild has to create (env TOLLGATE_REPLICAS)")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 {
		return cmd.usageError("no arguments expected, got %q", pos)
	}
	var err error
	if r.Since, err = parseWhen(*since); err != nil {
		return fail("replay: --since: %v", err)
	}
	if r.Until, err = parseWhen(*until); err != nil {
		return fail("replay: --until: %v", err)
	}
	if *rebuild && *dryRun {
		return fail("replay: --rebuild and --dry-run exclude each other (a dry run writes nothing)")
	}
	o := replay.Options{Range: r, Rebuild: *rebuild, DryRun: *dryRun, Topology: topology.DefaultConfig()}
	o.Topology.Replicas = replicas
	// The policy and keys judge a dry run's redrives, and judge again the
	// decisions no stream keeps (a lost approvals bucket:
	// replay.ReadJudging). A report or a rebuild goes on without them
	// (such an approval then comes back pending), saying so.
	pol, perr := policy.Load(*policyPath)
	keys, kerr := replayKeys(*sealKeys)
	switch err := errors.Join(perr, kerr); {
	case err != nil && *dryRun:
		return fail("replay: %v", err)
	case err != nil:
		fmt.Fprintf(os.Stderr, "replay: without the policy and seal keys (%v): a decision no stream keeps is not judged again\n", err)
	default:
		o.Policy, o.Keys = pol, keys
	}
	if err := c.connect(); err != nil {
		return c.fail("replay", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	rep, err := replay.Run(ctx, c.js, o)
	if err != nil {
		return c.fail("replay", err)
	}
	if c.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		_ = enc.Encode(rep)
		return 0
	}
	printReplay(out, rep)
	return 0
}

// parseWhen reads an RFC 3339 time, or a duration meaning that long ago;
// "" is no bound.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
	}
	return t.UTC(), nil
}

// replayKeys is the key ring a dry run verifies seals with: the one the
// stages use (flag or environment), else the key `tollgate dev` made. It
// never creates a key.
func replayKeys(path string) (*seal.KeyRing, error) {
	r, err := seal.FromEnv(path)
	if !errors.Is(err, seal.ErrNoKeys) {
		return r, err
	}
	dev := filepath.Join(scaffold.Env("TOLLGATE_DATA", "./.tollgate"), "seal-keys.json")
	if _, statErr := os.Stat(dev); statErr != nil {
		return nil, err
	}
	return seal.Load(dev)
}

func printReplay(w io.Writer, rep *replay.Report) {
	fmt.Fprintf(w, "replay (%s): %d turns, %d changes, %d conflicts", rep.Mode, len(rep.Turns), rep.Changes, rep.Conflicts)
	if rep.Mode == replay.ModeRebuild {
		fmt.Fprintf(w, ", %d notices", rep.Notices)
	} else if rep.Changes > 0 {
		fmt.Fprint(w, " (run with --rebuild to write them)")
	}
	fmt.Fprintln(w)
	for _, s := range rep.Warnings {
		fmt.Fprintf(w, "warning: %s\n", s)
	}
	if len(rep.Turns) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "TURN\tSESSION\tSTREAMS\tBATCH\tAPPROVALS")
	if rep.Mode == replay.ModeDryRun {
		fmt.Fprint(tw, "\tREDRIVE\tREASON")
	}
	fmt.Fprintln(tw)
	for _, t := range rep.Turns {
		var appr []string
		for _, a := range t.Approvals {
			appr = append(appr, fmt.Sprintf("%s %s", a.Key, change(a)))
		}
		if len(appr) == 0 {
			appr = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", t.TurnID, clip(t.SessionID, 24), t.State, change(t.Batch), strings.Join(appr, "; "))
		if s := t.Shadow; s != nil {
			kind := s.Kind
			if s.Code != "" {
				kind += " " + string(s.Code)
			}
			fmt.Fprintf(tw, "\t%s\t%s", kind, clip(s.Reason, 60))
		}
		fmt.Fprintln(tw)
		if t.Shadow != nil {
			for _, sc := range t.Shadow.Calls {
				fmt.Fprintf(tw, "  %s\t%s\t\t\t\tcall would %s\t%s\n", sc.CallID, sc.Tool, sc.Would, clip(strings.TrimSpace(string(sc.Status)+" "+string(sc.Code)+" "+sc.Reason), 80))
			}
		}
	}
	_ = tw.Flush()
	for _, g := range rep.Grants {
		if g.Action != replay.Unchanged {
			fmt.Fprintf(w, "grant %s: %s (%s)\n", g.Key, change(g), g.Streams)
		}
	}
	for _, s := range rep.Sessions {
		if s.Action != replay.Unchanged {
			fmt.Fprintf(w, "session %s: %s (%s)\n", s.Key, change(s), s.Streams)
		}
	}
	for _, t := range rep.Turns {
		for _, n := range t.Notes {
			fmt.Fprintf(w, "note %s: %s\n", t.TurnID, n)
		}
		for _, c := range append([]replay.Change{t.Batch}, t.Approvals...) {
			if c.Reason != "" && c.Action != replay.Unchanged {
				fmt.Fprintf(w, "%s %s: %s\n", c.Action, c.Key, c.Reason)
			}
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "skipped: %s\n", s)
	}
}

// change is a Change in a few words: "create (pending)", "update awaiting -> completed".
func change(c replay.Change) string {
	switch c.Action {
	case replay.Create:
		return fmt.Sprintf("create (%s)", c.Streams)
	case replay.Update:
		return fmt.Sprintf("update %s -> %s", c.KV, c.Streams)
	}
	if strings.HasPrefix(c.Reason, replay.LogKept) {
		return fmt.Sprintf("%s (%s, turn log)", c.Action, c.KV)
	}
	return fmt.Sprintf("%s (%s)", c.Action, c.KV)
}
