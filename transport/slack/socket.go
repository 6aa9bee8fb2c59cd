package slack

import (
	"context"
	"log/slog"

	"github.com/slack-go/slack/socketmode"
)

// RunSocketMode connects to Slack over Socket Mode (Config.API must carry
// the app-level token, slack.OptionAppLevelToken) and handles its
// envelopes until ctx ends, reconnecting as the library does. The
// connection is the app's own, opened with its token, so payloads need no
// signature; everything else is as in HTTP mode: events and actions are
// deduplicated, a click is checked before anything is published, and an
// envelope is acknowledged (by envelope_id) once its work is recorded.
// One whose work failed for a transient reason is not acknowledged, so
// Slack sends it again.
func (t *Transport) RunSocketMode(ctx context.Context, opts ...socketmode.Option) error {
	opts = append([]socketmode.Option{socketmode.OptionLog(slogOutput{t.log})}, opts...)
	smc := socketmode.New(t.cfg.API, opts...)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case evt := <-smc.Events:
				t.envelope(ctx, smc, evt)
			}
		}
	}()
	err := smc.RunContext(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// envelope handles one Socket Mode event.
func (t *Transport) envelope(ctx context.Context, smc *socketmode.Client, evt socketmode.Event) {
	var accept func(context.Context, []byte) (answer, error)
	switch evt.Type {
	case socketmode.EventTypeEventsAPI:
		accept = t.acceptEvent
	case socketmode.EventTypeInteractive:
		accept = t.acceptInteraction
	case socketmode.EventTypeErrorBadMessage:
		t.refuse(ReasonMalformed)
		return
	default:
		if evt.Request != nil && evt.Request.EnvelopeID != "" {
			_ = smc.AckCtx(ctx, evt.Request.EnvelopeID, nil)
		}
		return
	}
	if evt.Request == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, answerBudget)
	a, err := accept(wctx, evt.Request.Payload)
	cancel()
	if err != nil {
		t.log.Warn("slack: envelope failed; Slack will send it again", "err", err)
		return
	}
	if err := smc.AckCtx(ctx, evt.Request.EnvelopeID, nil); err != nil {
		t.log.Warn("slack: ack failed", "err", err)
	}
	if a.after != nil {
		t.later(a.after)
	}
}

// slogOutput adapts the logger to the socketmode library's.
type slogOutput struct{ log *slog.Logger }

func (s slogOutput) Output(_ int, msg string) error {
	s.log.Debug("slack socket mode", "msg", msg)
	return nil
}
