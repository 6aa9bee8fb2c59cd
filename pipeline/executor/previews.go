package executor

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// Previews of pending approvals (docs/tools.md, Previews).
//
// A batch's previews are taken all at once, each in a goroutine of its own,
// never one after another in the worker that runs the turn: the worker
// starts them, waits for them at most previewInlineWait, and when they are
// not all in by then it gives the turn back to the runner (errWaiting: the
// message is NAKed with a delay, not counted as a failure) and takes another session's turn. The redelivered turn finds
// the previews it started, by approval id, and writes its approval records
// with them once they are all in. So a tool whose previews hang holds up
// only the turns that call it, each by at most the preview deadline, and
// never the workers that run other sessions' turns.
//
// At most Config.PreviewsPerTool previews of one tool run at once in a
// process (tools.PreviewCallLimited): a preview waits for a slot within its
// own deadline, and a tool that ignores its context holds its slots, not
// more goroutines, until it answers.
//
// A preview is asked once per approval in a process: its result is kept
// until the record that carries it is written (the durable home of a
// preview: a redelivered turn whose record exists reuses it and asks for
// nothing), or previewKeep after it came in. Only a turn redelivered to
// another process, before its records were written, asks again there
// (a preview is read-only, so asking twice changes nothing).

// previewInlineWait is how long a worker waits for a batch's previews
// before it gives the turn back to the runner: long enough for a local
// preview (write_file's diff), short enough that a hanging one never holds
// the worker.
const previewInlineWait = 50 * time.Millisecond

// previewKeep is how long a preview that came in is kept for a turn that
// does not come back for it (redelivered to another process, or failed).
const previewKeep = time.Minute

// DefaultPreviewsPerTool is Config.PreviewsPerTool's default.
const DefaultPreviewsPerTool = 8

// previewer runs and keeps the previews of one executor.
type previewer struct {
	deadline time.Duration
	perTool  int
	count    func(status string) // a preview came in, with its status
	now      func() time.Time    // the time a preview is taken as of (ApprovalPreview.At)

	mu    sync.Mutex
	jobs  map[string]*previewJob   // by approval id
	turns map[string]previewSpan   // by turn id: its previews still running
	slots map[string]chan struct{} // by tool name
}

// previewSpan is when a turn's oldest running preview started and when its
// last one is due.
type previewSpan struct{ oldest, due time.Time }

// previewJob is one approval's preview, running or in.
type previewJob struct {
	started time.Time     // by the process's clock, as in
	done    chan struct{} // closed when res is set
	res     *schemas.ApprovalPreview
	in      time.Time // when res was set (under previewer.mu)
}

// previewAsk is a preview a batch needs: of call, by tool, for approval id.
type previewAsk struct {
	id   string
	tool tools.Tool
	call schemas.ToolCall
}

func newPreviewer(deadline time.Duration, perTool int, now func() time.Time, count func(string)) *previewer {
	if deadline <= 0 {
		deadline = tools.DefaultPreviewDeadline
	}
	if perTool <= 0 {
		perTool = DefaultPreviewsPerTool
	}
	return &previewer{deadline: deadline, perTool: perTool, now: now, count: count,
		jobs: map[string]*previewJob{}, turns: map[string]previewSpan{}, slots: map[string]chan struct{}{}}
}

// await starts each preview of asks that is not running or in yet, and
// waits at most wait for all of them. When all are in it returns them by
// approval id; otherwise nil and how long the turn should wait before it
// looks again (growing with the time the oldest has run, never past the
// time the last must be in by).
//
// The previews run under ctx's values but not its cancellation (the worker
// returns while they run), and with no authority: a preview acts for
// nobody (tools.Call.Context is nil).
func (p *previewer) await(ctx context.Context, turn string, asks []previewAsk, wait time.Duration) (map[string]*schemas.ApprovalPreview, time.Duration) {
	jobs := make([]*previewJob, len(asks))
	p.mu.Lock()
	p.sweep()
	for i, a := range asks {
		j, ok := p.jobs[a.id]
		if !ok {
			j = &previewJob{started: time.Now(), done: make(chan struct{})}
			p.jobs[a.id] = j
			go p.run(context.WithoutCancel(ctx), j, a, p.slotsOf(a.call.Tool))
		}
		jobs[i] = j
	}
	p.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	pending := false
	for _, j := range jobs {
		if pending {
			break
		}
		select {
		case <-j.done:
		case <-timer.C:
			pending = true
		}
	}
	out := make(map[string]*schemas.ApprovalPreview, len(asks))
	var oldest, due time.Time
	for i, j := range jobs {
		select {
		case <-j.done:
			out[asks[i].id] = j.res
			continue
		default:
		}
		if oldest.IsZero() || j.started.Before(oldest) {
			oldest = j.started
		}
		if d := j.started.Add(p.deadline); d.After(due) {
			due = d
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if oldest.IsZero() {
		delete(p.turns, turn)
		return out, 0
	}
	p.turns[turn] = previewSpan{oldest, due}
	return nil, retryAfter(oldest, due)
}

// retryAfter is how long a turn whose oldest running preview started at
// oldest and whose last one is due at due waits before it looks again:
// growing with the time they have run, from 2×previewInlineWait, and never
// much past due.
func retryAfter(oldest, due time.Time) time.Duration {
	r := max(time.Since(oldest), 2*previewInlineWait)
	return min(r, max(time.Until(due), 0)+10*time.Millisecond)
}

// busy reports whether turn's previews are still running, and if so how
// long the turn should wait before it looks again (retryAfter). A
// redelivered turn asks this before it reads anything, so that waiting on
// its previews costs no reads.
func (p *previewer) busy(turn string) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	span, ok := p.turns[turn]
	if !ok {
		return 0, false
	}
	if !time.Now().Before(span.due) {
		delete(p.turns, turn) // due: the previews are in, or come in now
		return 0, false
	}
	return retryAfter(span.oldest, span.due), true
}

// run takes job j's preview and keeps it.
func (p *previewer) run(ctx context.Context, j *previewJob, a previewAsk, slots chan struct{}) {
	at := p.now()
	r := tools.PreviewCallLimited(ctx, a.tool, tools.Call{CallID: a.call.CallID, Args: a.call.Args}, p.deadline, slots)
	p.count(r.Status)
	p.mu.Lock()
	j.res, j.in = r.Record(at), time.Now()
	p.mu.Unlock()
	close(j.done)
}

// slotsOf is tool's slots (p.mu held).
func (p *previewer) slotsOf(tool string) chan struct{} {
	s, ok := p.slots[tool]
	if !ok {
		s = make(chan struct{}, p.perTool)
		p.slots[tool] = s
	}
	return s
}

// forget drops approval id's preview: its record, which carries it, is
// written.
func (p *previewer) forget(id string) {
	p.mu.Lock()
	delete(p.jobs, id)
	p.mu.Unlock()
}

// sweep drops the previews that came in more than previewKeep ago and
// were never taken (p.mu held).
func (p *previewer) sweep() {
	cut := time.Now().Add(-previewKeep)
	for id, j := range p.jobs {
		if !j.in.IsZero() && j.in.Before(cut) {
			delete(p.jobs, id)
		}
	}
	for turn, span := range p.turns {
		if span.due.Before(cut) {
			delete(p.turns, turn)
		}
	}
}
