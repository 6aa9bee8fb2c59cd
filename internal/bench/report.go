package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is one bench run's results.
type Report struct {
	Started    time.Time  `json:"started"`
	Wall       string     `json:"wall"`
	Machine    Machine    `json:"machine"`
	Params     string     `json:"params"`
	Sequences  []Sequence `json:"sequences"`
	Throughput []Figure   `json:"throughput"`
	Efficiency []Ratio    `json:"efficiency"`
	Latency    []LatRow   `json:"latency"`
	Footprint  *footprint `json:"footprint,omitempty"`
	// ToolService is the toolservice phase's comparison.
	ToolService *ToolService `json:"tool_service,omitempty"`
	// Gateway is the gateway phase's comparison.
	Gateway *Gateway `json:"gateway,omitempty"`
	// Planner is the planner phase's comparison.
	Planner *Planner `json:"planner,omitempty"`
	// Inbox is the inbox phase's first-page figures.
	Inbox *Inbox `json:"inbox,omitempty"`
	// Approvals is the approvals phase's paged lists.
	Approvals *ApprovalLists `json:"approvals,omitempty"`
	Targets   []Target       `json:"targets"`
	Notes     []string       `json:"notes"`
	Errors    []string       `json:"errors"`
}

// Sequence is the traced operation sequence of one path.
type Sequence struct {
	Path    string `json:"path"`
	Steps   []step `json:"steps"`
	Raw     bool   `json:"raw"` // the raw turn repeats this one
	Matches bool   `json:"matches_raw_sequence"`
	Diff    string `json:"diff,omitempty"`
	Writes  Writes `json:"durable_writes"`
}

// Writes counts a turn's durable writes: the stream publishes and KV
// writes (create, update) whose acknowledgement says the write is stored.
// Under sync_interval: always each is one fsync before its
// acknowledgement on a single node (nats-server's filestore syncs every
// message it stores), so their number bounds a turn's rate at full
// durability. Client publishes (the inbound message; a decision published
// on TOLLGATE_DECISIONS) are counted: the turn needs them. A decision sent
// to the approver's service is a request, in no stream: not a write (its
// write is the approval record's revision). Consumer acknowledgements,
// answers and reads are not writes of the turn's facts and are not
// counted.
type Writes struct {
	Publishes int `json:"stream_publishes"`
	KV        int `json:"kv_writes"`
	Total     int `json:"total"`
}

// countWrites counts the durable writes among steps.
func countWrites(steps []step) Writes {
	var w Writes
	for _, s := range steps {
		switch s.Op {
		case "publish", "log.append":
			w.Publishes++
		case "kv.create", "kv.update":
			w.KV++
		}
	}
	w.Total = w.Publishes + w.KV
	return w
}

// Figure is one throughput figure: the median of its runs, with min-max.
type Figure struct {
	Sync    string   `json:"sync"` // "default" (2 min flush) or "always"
	Name    string   `json:"name"`
	Mode    string   `json:"mode,omitempty"`
	Path    string   `json:"path,omitempty"`
	Unit    string   `json:"unit"`
	Median  float64  `json:"median"`
	Min     float64  `json:"min"`
	Max     float64  `json:"max"`
	Samples []sample `json:"samples"`
}

// Ratio is Tollgate's rate over the raw turn's for one path and mode.
type Ratio struct {
	Sync       string  `json:"sync"`
	Path       string  `json:"path"`
	Mode       string  `json:"mode"`
	Efficiency float64 `json:"efficiency"` // median Tollgate / median raw turn
	// Per-round ratios (Tollgate and raw turn measured back to back).
	RoundMedian float64 `json:"round_median"`
	RoundMin    float64 `json:"round_min"`
	RoundMax    float64 `json:"round_max"`
}

// LatRow is one latency run's percentiles, in milliseconds.
type LatRow struct {
	Mode     string  `json:"mode"`
	Path     string  `json:"path"`
	Load     string  `json:"load"`
	Rate     float64 `json:"rate"`
	Achieved float64 `json:"achieved"`
	Sent     int     `json:"sent"`
	Timeouts int     `json:"timeouts"`
	Outcome  Pcts    `json:"outcome_ms"`  // inbound published -> turn outcome
	Decision *Pcts   `json:"decision_ms"` // decision published -> approved call started
	// Finished: decision published -> the approved call's result written
	// in its claim (right after the tool returned); Call: the approved
	// call's claim created -> its result written (the tool's run).
	Finished *Pcts `json:"finished_ms,omitempty"`
	Call     *Pcts `json:"call_ms,omitempty"`
}

// ToolService compares, in one run, the approval path's approved call
// built in (write_file, run inside the stage) with the same work behind a
// NATS tool service (benchTool), all-in-one.
type ToolService struct {
	// Rows: the built-in approved call, then the tool service's.
	Rows []ToolRow `json:"rows"`
	// Ratio*: tool service turns/s ÷ built-in turns/s, per round (the two
	// measured back to back).
	RatioMedian float64 `json:"ratio_round_median"`
	RatioMin    float64 `json:"ratio_round_min"`
	RatioMax    float64 `json:"ratio_round_max"`
	// Hop*: the tool service row's call time (claim created -> result
	// written) minus the built-in row's, at low load, in milliseconds:
	// what the remote hop costs.
	HopP50 float64 `json:"hop_p50_ms"`
	HopP99 float64 `json:"hop_p99_ms"`
	// RoundTrip: bare request round trips to the tool service (an endpoint
	// that answers at once), one per turn interval during the tool
	// service row's latency run, from a connection of their own.
	RoundTrip Pcts `json:"round_trip_ms"`
}

// ToolRow is one approved call's figures in the ToolService comparison.
type ToolRow struct {
	Tool       string `json:"tool"`
	Throughput Figure `json:"throughput"`
	Latency    LatRow `json:"latency"`
}

// Gateway compares, in one run, the approval path's turn submitted and
// decided over NATS (the driver and its decider) and over the HTTP gateway
// in this process, all-in-one, in closed loops at the same concurrency.
type Gateway struct {
	// Rows: NATS, then HTTP.
	Rows []GatewayRow `json:"rows"`
	// Ratio*: HTTP turns/s ÷ NATS turns/s, per round (the two measured
	// back to back).
	RatioMedian float64 `json:"ratio_round_median"`
	RatioMin    float64 `json:"ratio_round_min"`
	RatioMax    float64 `json:"ratio_round_max"`
	// Added*: the HTTP row's latency minus the NATS row's.
	AddedPending   Added `json:"added_submit_to_pending_ms"`
	AddedCompleted Added `json:"added_decision_to_completed_ms"`
	AddedTurn      Added `json:"added_turn_ms"`
}

// GatewayRow is one transport's figures in the Gateway comparison, its
// latencies over the closed loops' turns inside the windows.
type GatewayRow struct {
	Transport  string `json:"transport"`
	Throughput Figure `json:"throughput"`
	// Pending: turn sent -> its approval seen pending (NATS: the
	// approval-requested event; HTTP: the submit's answer). Completed:
	// decision sent -> the turn seen ended (NATS: the outcome event; HTTP:
	// the answer of GET ?wait, after the decision's answer). Turn: sent ->
	// ended.
	Pending   Pcts `json:"submit_to_pending_ms"`
	Completed Pcts `json:"decision_to_completed_ms"`
	Turn      Pcts `json:"turn_ms"`
}

// Added is a latency difference in milliseconds.
type Added struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// Pcts are latency percentiles in milliseconds over N samples.
type Pcts struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// Target is one performance target: what is wanted, what was measured,
// and whether it passed.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
	Note string `json:"note,omitempty"`
}

func median(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		med = s[n/2]
	} else {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// percentiles uses the nearest rank.
func percentiles(ds []time.Duration) Pcts {
	if len(ds) == 0 {
		return Pcts{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1
		i = min(max(i, 0), len(s)-1)
		return float64(s[i]) / float64(time.Millisecond)
	}
	return Pcts{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: float64(s[len(s)-1]) / float64(time.Millisecond)}
}

// figure returns the figure named name, mode, path and sync, or nil.
func (r *Report) figure(sync, name, mode, path string) *Figure {
	for i := range r.Throughput {
		f := &r.Throughput[i]
		if f.Sync == sync && f.Name == name && f.Mode == mode && f.Path == path {
			return f
		}
	}
	return nil
}

// WriteFiles writes the report as JSON and markdown into dir, named by its
// start time, and as latest.json and latest.md.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	var md strings.Builder
	r.Markdown(&md)
	stamp := r.Started.UTC().Format("20060102T150405Z")
	var paths []string
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"bench-" + stamp + ".json", j}, {"bench-" + stamp + ".md", []byte(md.String())},
		{"latest.json", j}, {"latest.md", []byte(md.String())},
	} {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.data, 0o640); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func passMark(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// Markdown writes the report as markdown.
func (r *Report) Markdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	m := r.Machine
	p("# Tollgate bench report")
	p("")
	p("Started %s, wall %s.", r.Started.UTC().Format(time.RFC3339), r.Wall)
	p("")
	p("Machine: %d cores (GOMAXPROCS %d), %s, %s/%s, CPU %q, load average %s at start, %s at end; nats-server %s (embedded, file storage, loopback), nats.go %s.",
		m.Cores, m.GOMAXPROCS, m.GoVersion, m.OS, m.Arch, m.CPU, m.LoadStart, m.LoadEnd, m.NATSServer, m.NATSGo)
	p("")
	p("Parameters: `%s`", r.Params)
	p("")
	if len(r.Targets) > 0 {
		p("## Targets")
		p("")
		p("| target | want | measured | result |")
		p("|---|---|---|---|")
		for _, t := range r.Targets {
			note := ""
			if t.Note != "" {
				note = " (" + t.Note + ")"
			}
			p("| %s | %s | %s%s | %s |", t.Name, t.Want, t.Got, note, passMark(t.Pass))
		}
		p("")
	}
	if len(r.Throughput) > 0 {
		p("## Throughput")
		p("")
		p("Median of the runs, [min-max]. Tollgate and raw turns: closed loop, %s turns in flight.", concurrencyOf(r.Params))
		p("")
		p("| sync_interval | figure | median | min-max | notes |")
		p("|---|---|---|---|---|")
		for _, f := range r.Throughput {
			p("| %s | %s | %.0f %s | %.0f-%.0f | %s |", f.Sync, f.label(), f.Median, f.Unit, f.Min, f.Max, f.notes())
		}
		p("")
	}
	if len(r.Efficiency) > 0 {
		p("## Efficiency (Tollgate turns/s ÷ raw turns/s, same run)")
		p("")
		p("| sync_interval | path | mode | median ÷ median | per-round median [min-max] |")
		p("|---|---|---|---|---|")
		for _, e := range r.Efficiency {
			p("| %s | %s | %s | %.2f | %.2f [%.2f-%.2f] |", e.Sync, e.Path, e.Mode, e.Efficiency, e.RoundMedian, e.RoundMin, e.RoundMax)
		}
		p("")
	}
	if len(r.Latency) > 0 {
		p("## Latency (ms)")
		p("")
		p("Open loop at a fixed rate (offered; achieved: the sampled turns over the time from the first one's publish to the last one's outcome, below offered when the load exceeded what the pipeline sustained at that moment, and queues grew); each turn in a session of its own at that moment. Outcome: inbound message published -> turn outcome received (approval path: includes the automated decision). Decision: decision published -> the approved call's execution claim written (the tool starts right after).")
		p("")
		p("| mode | path | load | offered/s | achieved/s | n | outcome p50 | p99 | p99.9 | max | decision n | decision p50 | p99 | p99.9 | max | timeouts |")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, l := range r.Latency {
			dec := "| - | - | - | - | -"
			if l.Decision != nil {
				d := l.Decision
				dec = fmt.Sprintf("| %d | %.2f | %.2f | %.2f | %.2f", d.N, d.P50, d.P99, d.P999, d.Max)
			}
			o := l.Outcome
			p("| %s | %s | %s | %.0f | %.0f | %d | %.2f | %.2f | %.2f | %.2f %s | %d |", l.Mode, l.Path, l.Load, l.Rate, l.Achieved, o.N, o.P50, o.P99, o.P999, o.Max, dec, l.Timeouts)
		}
		p("")
	}
	if ts := r.ToolService; ts != nil {
		p("## Approved call behind a NATS tool service (all-in-one, same run)")
		p("")
		p("The approval path (echo, then a call approved by the automated decider) with the approved call built in (`write_file`, run inside the stage) and with the same work behind a NATS tool service (`%s`: `tools.WriteFile` in a micro service on its own connection, found by discovery and called by request/reply). Turns/s: closed loop, median of the rounds [min-max]. Latencies: open loop at the low rate; started and finished: the approved call's claim created and its result written, seen by the driver.", benchTool)
		p("")
		p("| approved call | turns/s | min-max | low load n | outcome p50 | p99 | decision -> started p50 | p99 | decision -> finished p50 | p99 | call p50 | p99 |")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, row := range ts.Rows {
			f, l := row.Throughput, row.Latency
			p("| %s | %.0f | %.0f-%.0f | %d | %.2f | %.2f | %s | %s | %s |", row.Tool, f.Median, f.Min, f.Max, l.Outcome.N, l.Outcome.P50, l.Outcome.P99,
				pctPair(l.Decision), pctPair(l.Finished), pctPair(l.Call))
		}
		p("")
		p("- Turns/s, tool service ÷ built in, per round: %.2f [%.2f-%.2f].", ts.RatioMedian, ts.RatioMin, ts.RatioMax)
		p("- The hop (call time, tool service − built in): p50 **%.3f ms**, p99 %.3f ms; a bare request round trip to the service during the same run: p50 **%.3f ms**, p99 %.3f ms (n=%d).",
			ts.HopP50, ts.HopP99, ts.RoundTrip.P50, ts.RoundTrip.P99, ts.RoundTrip.N)
		p("")
	}
	if g := r.Gateway; g != nil {
		p("## Approval turns over the HTTP gateway and over NATS (all-in-one, same run)")
		p("")
		p("The approval path's turn (echo, and write_file needing approval), closed loop at %s turns in flight: over NATS, the driver publishes the inbound message and its decider publishes the decision on the approval-requested event; over HTTP, each slot POSTs /v1/turns (answered with the pending approval and its digest), POSTs the decision with that digest, then GETs the turn with ?wait until it has ended, through the gateway in this process, on a keep-alive HTTP/1.1 connection per slot that the slot writes requests to and reads answers from itself, as a load generator such as wrk does (net/http's Client would spend the shared cores on its own goroutine hand-offs). Turns/s: median of the rounds [min-max]. Latencies (ms) over the turns inside the windows of all rounds: pending = sent -> approval seen pending; completed = decision sent -> turn seen ended.", concurrencyOf(r.Params))
		p("")
		p("| transport | turns/s | min-max | n | pending p50 | p99 | completed p50 | p99 | turn p50 | p99 | notes |")
		p("|---|---|---|---|---|---|---|---|---|---|---|")
		for _, row := range g.Rows {
			f := row.Throughput
			p("| %s | %.0f | %.0f-%.0f | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |", row.Transport, f.Median, f.Min, f.Max, row.Turn.N,
				row.Pending.P50, row.Pending.P99, row.Completed.P50, row.Completed.P99, row.Turn.P50, row.Turn.P99, f.notes())
		}
		p("")
		p("- Turns/s, HTTP ÷ NATS, per round: **%.2f** [%.2f-%.2f].", g.RatioMedian, g.RatioMin, g.RatioMax)
		p("- Added by HTTP (HTTP − NATS): submit -> pending p50 %+.2f ms, p99 %+.2f ms; decision -> completed p50 %+.2f ms, p99 %+.2f ms; whole turn p50 %+.2f ms, p99 %+.2f ms.",
			g.AddedPending.P50, g.AddedPending.P99, g.AddedCompleted.P50, g.AddedCompleted.P99, g.AddedTurn.P50, g.AddedTurn.P99)
		p("")
	}
	if pl := r.Planner; pl != nil {
		p("## A planner turn next to the plain turns (all-in-one, same run)")
		p("")
		p("The planner turn is a text-only message that the planner stage drives against a scripted OpenAI-compatible model in this process (pipeline/planner/plannertest, answering at once): step 1 answers with one echo call (the fast path's call, run at once), step 2 with the final text; two model requests and one step batch. Closed loops: at %d turns in flight, rounds with the three turns back to back (turns/s: median of the rounds [min-max]); then with one turn in flight, one run each. Turn latency (ms): sent -> outcome over the turns inside the windows.", pl.Loaded.InFlight)
		p("")
		p("| turn | in flight | turns/s | min-max | n | turn p50 | p99 | notes |")
		p("|---|---|---|---|---|---|---|---|")
		for _, l := range []PlannerLoad{pl.Loaded, pl.Single} {
			for _, row := range l.Rows {
				f := row.Throughput
				p("| %s | %d | %.0f | %.0f-%.0f | %d | %.2f | %.2f | %s |", row.Path, l.InFlight, f.Median, f.Min, f.Max, row.Turn.N, row.Turn.P50, row.Turn.P99, f.notes())
			}
		}
		p("")
		p("- Turns/s, planner ÷ fast, per round (%d in flight): %.2f [%.2f-%.2f].", pl.Loaded.InFlight, pl.RatioMedian, pl.RatioMin, pl.RatioMax)
		p("- **Planner overhead per step**: the planner turn's time from its publish for the planner to its outcome, less the step batch (seen on the accepted subject -> its outcome) and the two model requests (as the planner timed them), over the two steps.")
		p("")
		p("| in flight | overhead per step p50 | p99 | n | model request (planner's timing) | step batch p50 | p99 | ingest p50 | p99 |")
		p("|---|---|---|---|---|---|---|---|---|")
		for _, l := range []PlannerLoad{pl.Single, pl.Loaded} {
			p("| %d | **%.2f** | %.2f | %d | %.2f | %.2f | %.2f | %.2f | %.2f |", l.InFlight, l.Overhead.P50, l.Overhead.P99, l.Overhead.N, l.ModelMsPerCall, l.Batch.P50, l.Batch.P99, l.Ingest.P50, l.Ingest.P99)
		}
		p("")
		p("- The overhead includes the step batch's way to the accepted subject: the planner publishes it on tollgate.turn.step.<batch>, and ingest checks it and publishes it as the accepted turn (no message schedule, no timer).")
		p("")
	}
	if in := r.Inbox; in != nil {
		p("## Web inbox first page (%d approvals pending, all decidable by the person)", in.Pending)
		p("")
		p("| query | n | p50 ms | p95 ms | max ms | HTML | rows |")
		p("|---|---|---|---|---|---|---|")
		for _, pg := range in.Pages {
			p("| `%s` | %d | **%.1f** | **%.1f** | %.1f | %.1f KiB | %d |", pg.Query, pg.N, pg.P50, pg.P95, pg.Max, float64(pg.Bytes)/1024, pg.Rows)
		}
		p("")
		p("- Seeded %d pending approvals (written as the executor writes them) in %.1f s; the inbox's pending index was built from the bucket and the first page answered %.1f s after web.New.", in.Pending, in.SeedSec, in.IndexSec)
		p("- Time to the last byte of the page over a keep-alive loopback connection, signed in (the session read from its KV bucket), sequential loads.")
		p("")
	}
	if a := r.Approvals; a != nil {
		p("## GET /v1/approvals, paged (%d approvals pending, %d clients at once)", a.Pending, listClients)
		p("")
		p("| limit | requests | p50 ms | p99 ms | max ms | page |")
		p("|---|---|---|---|---|---|")
		for _, sw := range a.Sweeps {
			p("| %d | %d | **%.1f** | **%.1f** | %.1f | %.1f KiB |", sw.Limit, sw.N, sw.P50, sw.P99, sw.Max, float64(sw.AvgBytes)/1024)
		}
		p("")
		p("- `tollgate gateway` as its own process: resident memory %.1f MiB after its first page, %.1f MiB at its peak (VmHWM) over the run.", float64(a.RSSIdle)/(1<<20), float64(a.RSSPeak)/(1<<20))
		p("- Seeded %d pending approvals in %.1f s; the gateway answered its first page %.1f s after it started (its approvals index built from the bucket). Each client pages through the whole list with its own read key, at most one request per %v (a key's default rate), time to the last byte over keep-alive loopback connections.", a.Pending, a.SeedSec, a.IndexSec, listPace)
		p("")
	}
	if f := r.Footprint; f != nil {
		p("## Footprint (stages as separate processes, %d approvals pending)", f.Pending)
		p("")
		p("| worker | RSS idle | RSS with %d pending | peak (VmHWM) |", f.Pending)
		p("|---|---|---|---|")
		for _, s := range stageNames {
			p("| %s | %s | %s | %s |", s, mib(f.RSSIdle[s]), mib(f.RSSPending[s]), mib(f.RSSPeak[s]))
		}
		p("| bench process (embedded nats-server + driver) | | %s | |", mib(f.BenchRSS))
		p("")
		per := 0.0
		if f.ApprovalMsgs > 0 {
			per = float64(f.ApprovalBytes) / float64(f.ApprovalMsgs)
		}
		p("- KV per pending approval: approvals bucket %d bytes / %d records = **%.0f B**; all four buckets and the turn logs %d bytes = %.0f B per pending turn (batch and session records included; a turn log keeps each write of its batch).",
			f.ApprovalBytes, f.ApprovalMsgs, per, f.AllKVBytes, float64(f.AllKVBytes)/float64(max(f.Pending, 1)))
		p("- Populate: %d turns to pending in %.1f s (%.0f/s). Decide: all approved by the approver (redriver stopped) in %.1f s.", f.Pending, f.PopulateSec, float64(f.Pending)/f.PopulateSec, f.DecideSec)
		p("- **Recovery**: redriver restarted with %d decided-but-not-redriven batches: every outcome in **%.1f s** (%.0f batches/s), redriver RSS after %s, peak %s.",
			f.Pending, f.RecoverySec, float64(f.Pending)/f.RecoverySec, mib(f.RedriverRSS), mib(f.RedriverPeak))
		p("")
	}
	if len(r.Sequences) > 0 {
		p("## What one turn does (traced; the raw turn repeats it)")
		p("")
		p("Each turn is the second of its session, with another session's turn between the two, traced with the stages working one at a time. The turn runs once the batch before it in its session's order has ended: its entry names that turn, which the engine that ended it remembers as ended (a stage process that did not end it reads its last event, one stream.get more), and nothing is read or written for the session. Whoever ends the batch reads nothing for the session: a turn queued behind it is woken by the redriver's watch of the turn logs when it delivers the end (here none waits). The executor creates the batch without reading tollgate_batches (a turn placed in its session's order has no earlier version's batch there); the approver applies the decision on the approval's revision its watch delivered, by compare-and-set at it, without reading it; the redriver takes the decided approval, and whether its retention started, from the revision it consumes, and the batch from the awaiting event its recovery sweep's watch of the turn logs delivered, moving it to started by compare-and-set after that event. A stream.get is a JetStream API request for a stream message: `last` the last one on a subject, `next` the first one on a filter from a sequence on. Not shown: the approver's KV watch on the approvals bucket and the redriver's on the turn logs and the batches and sessions buckets receive every write; the raw stages hold the same watches. Durable writes are the stream publishes and KV creates and updates (a failed create is not one): under sync_interval: always each is one fsync before its acknowledgement on a single node, so their count, not Tollgate's CPU, bounds the rate at full durability.")
		p("")
		for _, s := range r.Sequences {
			match := ""
			switch {
			case s.Raw && s.Matches:
				match = "; the raw turn's sequence matches it"
			case s.Raw:
				match = "; DIFFERS from the raw turn's sequence: " + s.Diff
			}
			p("%s path, %d steps, %d durable writes (%d stream publishes, %d KV writes)%s:", s.Path, len(s.Steps), s.Writes.Total, s.Writes.Publishes, s.Writes.KV, match)
			p("")
			p("```")
			for i, st := range s.Steps {
				p("%2d %s", i+1, st)
			}
			p("```")
			p("")
		}
	}
	if len(r.Notes) > 0 {
		p("## Notes")
		p("")
		for _, n := range r.Notes {
			p("- %s", n)
		}
		p("")
	}
	if len(r.Errors) > 0 {
		p("## Errors")
		p("")
		for _, e := range r.Errors {
			p("- %s", e)
		}
		p("")
	}
}

// pctPair is "p50 | p99" of p, or "- | -".
func pctPair(p *Pcts) string {
	if p == nil || p.N == 0 {
		return "- | -"
	}
	return fmt.Sprintf("%.2f | %.2f", p.P50, p.P99)
}

func (f Figure) label() string {
	switch {
	case f.Name == "tollgate":
		return fmt.Sprintf("**Tollgate %s, %s**", f.Path, f.Mode)
	case f.Path != "":
		return fmt.Sprintf("%s %s, %s", f.Name, f.Path, f.Mode)
	default:
		return f.Name
	}
}

func (f Figure) notes() string {
	var allocs, bytes, deferred, early, cpu, stages, flushes, writes, toPending, toOutcome []float64
	timeouts, errs, conflicts, retries, dead := 0, int64(0), int64(0), 0.0, 0.0
	for _, s := range f.Samples {
		if s.AllocsPerTurn > 0 {
			allocs = append(allocs, s.AllocsPerTurn)
			bytes = append(bytes, s.BytesPerTurn)
		}
		if f.Name == "tollgate" && f.Mode == modeAllInOne && f.Path == approvalPath.String() && s.Rate > 0 {
			deferred = append(deferred, s.DeferredPerTurn)
			early = append(early, s.EarlyPerTurn)
		}
		if s.CPUPerTurn > 0 {
			cpu = append(cpu, s.CPUPerTurn)
		}
		if s.StagesCPUPerTurn > 0 {
			stages = append(stages, s.StagesCPUPerTurn)
		}
		if s.DiskFlushesPerTurn > 0 {
			flushes = append(flushes, s.DiskFlushesPerTurn)
		}
		if s.WritesPerTurn > 0 {
			writes = append(writes, s.WritesPerTurn)
		}
		if s.ToPendingMs > 0 {
			toPending = append(toPending, s.ToPendingMs)
			toOutcome = append(toOutcome, s.DecisionToOutcomeMs)
		}
		timeouts += s.Timeouts
		errs += s.Errors
		conflicts += s.Conflicts
		retries += s.Retries
		dead += s.DeadLetters
	}
	var n []string
	if len(cpu) > 0 {
		c, _, _ := median(cpu)
		if len(stages) > 0 {
			st, _, _ := median(stages)
			n = append(n, fmt.Sprintf("CPU %.2f ms/turn in the stage processes + %.2f in the server and driver", st, c))
		} else {
			n = append(n, fmt.Sprintf("CPU %.2f ms/turn (whole process)", c))
		}
	}
	if len(flushes) > 0 && f.Sync == "always" {
		// Only where every write is an fsync: in the default mode the
		// count is the 2-minute flush's and the kernel's, not the turn's.
		m, _, _ := median(flushes)
		n = append(n, fmt.Sprintf("%.1f disk flushes/turn", m))
	}
	if len(writes) > 0 {
		w, _, _ := median(writes)
		n = append(n, fmt.Sprintf("%.1f writes/turn", w))
	}
	if len(toPending) > 0 {
		p, _, _ := median(toPending)
		o, _, _ := median(toOutcome)
		n = append(n, fmt.Sprintf("p50 %.1f ms to the approval request, %.1f ms from the decision to the outcome", p, o))
	}
	if len(allocs) > 0 {
		a, _, _ := median(allocs)
		b, _, _ := median(bytes)
		n = append(n, fmt.Sprintf("%.0f allocs, %.0f KiB per turn (whole process)", a, b/1024))
	}
	if len(deferred) > 0 {
		d, _, _ := median(deferred)
		w, _, _ := median(early)
		n = append(n, fmt.Sprintf("%.2f deferred redrives, %.2f early decided events NAKed per started", d, w))
	}
	if timeouts > 0 {
		n = append(n, fmt.Sprintf("%d timed out", timeouts))
	}
	if errs > 0 {
		n = append(n, fmt.Sprintf("%d errors", errs))
	}
	if retries > 0 {
		n = append(n, fmt.Sprintf("%.0f NAKed for retry", retries))
	}
	if dead > 0 {
		n = append(n, fmt.Sprintf("%.0f DEAD-LETTERED", dead))
	}
	if conflicts > 0 {
		n = append(n, fmt.Sprintf("%d CAS conflicts", conflicts))
	}
	return strings.Join(n, "; ")
}

func concurrencyOf(params string) string {
	for _, f := range strings.Fields(params) {
		if v, ok := strings.CutPrefix(f, "concurrency="); ok {
			return v
		}
	}
	return "?"
}
