package bench

import (
	"context"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
)

// modelSeconds is the planner's histogram of model request times.
const modelSeconds = "tollgate_planner_model_seconds"

// plannerSteps is the number of model steps of a planner path turn: the
// echo call, then the answer.
const plannerSteps = 2

// startBenchModel starts the scripted model of the planner path: every
// conversation of plannerText is answered at once with one echo call, then
// the final text.
func startBenchModel() (*plannertest.Server, error) {
	m, err := plannertest.Start()
	if err != nil {
		return nil, err
	}
	m.Script(plannerText,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "echo", Args: `{"text":"hi"}`}}},
		plannertest.Reply{Text: "done"})
	return m, nil
}

// Planner compares, in one run, a planner turn (plannerPath) with the
// plain fast and approval turns, all-in-one, in closed loops: at the
// configured concurrency (Runs rounds, the three paths back to back in
// each), and with one turn in flight (one run of the fast and planner
// paths over the latency duration), where the planner's own time is not
// queueing behind other turns.
type Planner struct {
	Loaded PlannerLoad `json:"loaded"`
	Single PlannerLoad `json:"single"`
	// Ratio*: planner turns/s ÷ fast turns/s, per round, loaded.
	RatioMedian float64 `json:"ratio_round_median"`
	RatioMin    float64 `json:"ratio_round_min"`
	RatioMax    float64 `json:"ratio_round_max"`
}

// PlannerLoad is the planner comparison at one concurrency.
type PlannerLoad struct {
	InFlight int          `json:"in_flight"`
	Rows     []PlannerRow `json:"rows"`
	// ModelMsPerCall: one model request as the planner timed it (mean in
	// each window, median of the runs).
	ModelMsPerCall float64 `json:"model_ms_per_call"`
	// Over the planner turns inside the windows: Ingest, turn sent ->
	// published for the planner; Batch, the first step's batch seen on the
	// accepted subject -> that batch's outcome; Overhead, the planner's own time
	// per step (overheadPerStep).
	Ingest   Pcts `json:"ingest_ms"`
	Batch    Pcts `json:"step_batch_ms"`
	Overhead Pcts `json:"overhead_per_step_ms"`
}

// PlannerRow is one path's figures in a PlannerLoad; Turn is sent ->
// outcome over the closed loop's turns inside the windows.
type PlannerRow struct {
	Path       string `json:"path"`
	Throughput Figure `json:"throughput"`
	Turn       Pcts   `json:"turn_ms"`
}

// planner is the planner phase (see Planner).
func (b *bencher) planner(ctx context.Context, r *Report) {
	paths := []path{fastPath, approvalPath, plannerPath}
	samples := b.rounds(ctx, r, "planner", paths)
	pl := &Planner{Loaded: plannerLoad(b.cfg.Concurrency, paths, samples)}
	pl.RatioMedian, pl.RatioMin, pl.RatioMax = roundRatios(samples[2], samples[0])

	one := &bencher{cfg: b.cfg, keys: b.keys, seqs: b.seqs}
	one.cfg.Concurrency, one.cfg.Duration, one.cfg.Runs = 1, b.cfg.LatencyDuration, 1
	paths = []path{fastPath, plannerPath}
	pl.Single = plannerLoad(1, paths, one.rounds(ctx, r, "planner, one turn in flight,", paths))
	r.Planner = pl
}

// plannerLoad sums up samples, the runs of paths at inFlight.
func plannerLoad(inFlight int, paths []path, samples [][]sample) PlannerLoad {
	l := PlannerLoad{InFlight: inFlight}
	var model []float64
	var ingest, batch, overhead []time.Duration
	for i, p := range paths {
		row := PlannerRow{Path: p.String(), Throughput: allInOneFigure(p, samples[i])}
		var turn []time.Duration
		for _, s := range samples[i] {
			for _, t := range s.turns {
				turn = append(turn, t.done.Sub(t.sent))
			}
			if p != plannerPath || s.Rate <= 0 {
				continue
			}
			model = append(model, s.ModelMsPerCall)
			for _, t := range s.turns {
				if t.planned.IsZero() || t.scheduled.IsZero() || t.stepDone.IsZero() {
					continue
				}
				ingest = append(ingest, t.planned.Sub(t.sent))
				batch = append(batch, t.stepDone.Sub(t.scheduled))
				overhead = append(overhead, overheadPerStep(t, s.ModelMsPerCall))
			}
		}
		row.Turn = percentiles(turn)
		l.Rows = append(l.Rows, row)
	}
	l.ModelMsPerCall, _, _ = median(model)
	l.Ingest, l.Batch, l.Overhead = percentiles(ingest), percentiles(batch), percentiles(overhead)
	return l
}

// overheadPerStep is the planner's own time per model step of planner
// turn t: from the turn's publish for the planner to its outcome, less the
// step batch (seen on the accepted subject -> its outcome) and the model
// requests (modelMs each, as the planner timed them), over the steps. What
// is left is the planner's work around each model request: taking the
// message, building the request, recording the step, getting the step
// batch to the accepted subject (through ingest), taking the batch's
// outcome, and ending the turn.
func overheadPerStep(t turnTimes, modelMs float64) time.Duration {
	own := t.done.Sub(t.planned) - t.stepDone.Sub(t.scheduled) - time.Duration(plannerSteps*modelMs*float64(time.Millisecond))
	return own / plannerSteps
}
