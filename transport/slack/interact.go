package slack

import (
	"context"
	"net/http"
	"strings"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Action ids of a prompt's buttons and the callback id of the deny modal.
const (
	ActionApprove = "tollgate_approve"
	ActionDeny    = "tollgate_deny"
	ActionArgs    = "tollgate_args"
	// ActionGrantPrefix + a grant option ("approve-session") is the
	// action id of that option's button: the option it decides with,
	// bound to the approval and digest by the button's value like
	// Approve's.
	ActionGrantPrefix = "tollgate_grant:"
	ViewDeny          = "tollgate_deny_reason"
	denyBlock         = "reason"
	denyInput         = "reason_input"
)

// buttonValue is the value of a prompt's buttons: "<approval id> <digest>".
func buttonValue(approvalID, digest string) string { return approvalID + " " + digest }

func parseValue(v string) (approvalID, digest string, ok bool) {
	approvalID, digest, ok = strings.Cut(v, " ")
	return approvalID, digest, ok && schemas.ValidKey(approvalID) && digest != ""
}

// acceptInteraction handles one interaction payload (HTTP or Socket Mode).
// Before anything is published the click is checked: a known action id,
// a button on the approval's own prompt with the approval's digest (else
// 400), an action not seen before (else 200, skipped), an approval still
// pending and not expired (else 200 and an ephemeral message with the
// code, nothing published). An error is transient (nothing published).
func (t *Transport) acceptInteraction(ctx context.Context, raw []byte) (answer, error) {
	cb, ok := parseInteraction(raw)
	if !ok || cb.User.ID == "" || cb.Team.ID == "" {
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonMalformed)}, nil
	}
	switch cb.Type {
	case slack.InteractionTypeBlockActions:
		return t.blockAction(ctx, cb)
	case slack.InteractionTypeViewSubmission:
		return t.viewSubmission(ctx, cb)
	}
	return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
}

// check binds a click to an approval (chat.Transport.Check): value names
// it and its whole digest, and the clicked message (channel, ts) is its
// prompt.
func (t *Transport) check(ctx context.Context, value, channel, ts string) (*chat.Target, string, error) {
	id, digest, ok := parseValue(value)
	if !ok {
		return nil, ReasonActionMismatch, nil
	}
	return t.core.Check(ctx, chat.Click{ApprovalID: id, Digest: digest, Channel: channel, MessageID: ts})
}

func (t *Transport) blockAction(ctx context.Context, cb *slack.InteractionCallback) (answer, error) {
	if len(cb.ActionCallback.BlockActions) != 1 {
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
	}
	act := cb.ActionCallback.BlockActions[0]
	grant, isGrant := strings.CutPrefix(act.ActionID, ActionGrantPrefix)
	switch {
	case act.ActionID == ActionApprove, act.ActionID == ActionDeny, act.ActionID == ActionArgs:
	case isGrant && schemas.IsGrantOption(grant):
	default:
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
	}
	tg, reason, err := t.check(ctx, act.Value, cb.Container.ChannelID, cb.Container.MessageTs)
	if err != nil {
		return answer{}, err
	}
	if reason != "" {
		return answer{status: http.StatusBadRequest, reason: t.refuse(reason)}, nil
	}
	if act.ActionID == ActionArgs {
		trigger := cb.TriggerID
		return answer{after: func(ctx context.Context) { t.openView(ctx, trigger, argsView(tg.Rec)) }}, nil
	}
	if isGrant && !tg.Rec.Offers(grant) {
		// A grant option the prompt did not offer (the approver would
		// refuse it too): nothing is published.
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
	}
	seen := hashKey("action", cb.Team.ID, cb.User.ID, act.ActionID, act.ActionTs, cb.Container.MessageTs)
	fresh, err := t.core.MarkSeen(ctx, seen)
	if err != nil {
		return answer{}, err
	}
	if !fresh {
		return answer{reason: t.refuse(ReasonDuplicate)}, nil
	}
	if a, closed := t.notPending(tg, cb.User.ID); closed {
		return a, nil
	}
	if isGrant {
		// A grant option decides like Approve (or, "deny-*", like Deny
		// without a note), with that option.
		return answer{}, t.decideOnce(ctx, seen, cb, tg, grant, act.ActionTs, "")
	}
	if act.ActionID == ActionDeny {
		trigger := cb.TriggerID
		meta := buttonValue(tg.Rec.ApprovalID, tg.Rec.ArgsDigest) + " " + tg.Prompt.Channel + " " + tg.Prompt.MessageID
		return answer{after: func(ctx context.Context) { t.openView(ctx, trigger, denyView(tg.Rec, meta)) }}, nil
	}
	return answer{}, t.decideOnce(ctx, seen, cb, tg, schemas.OptionApprove, act.ActionTs, "")
}

// notPending answers a click on an approval that can no longer be
// decided (chat.Transport.Undecidable): an ephemeral message with the
// code, nothing published.
func (t *Transport) notPending(tg *chat.Target, user string) (answer, bool) {
	notice, closed := t.core.Undecidable(tg.Rec)
	if !closed {
		return answer{}, false
	}
	channel := tg.Prompt.Channel
	return answer{reason: ReasonNotPending, after: func(ctx context.Context) {
		if err := t.ephemeral(ctx, channel, user, notice); err != nil {
			t.log.Warn("slack: chat.postEphemeral failed", "err", err)
		}
	}}, true
}

func (t *Transport) viewSubmission(ctx context.Context, cb *slack.InteractionCallback) (answer, error) {
	if cb.View.CallbackID != ViewDeny {
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
	}
	parts := strings.Split(cb.View.PrivateMetadata, " ")
	if len(parts) != 4 {
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonActionMismatch)}, nil
	}
	tg, reason, err := t.check(ctx, parts[0]+" "+parts[1], parts[2], parts[3])
	if err != nil {
		return answer{}, err
	}
	if reason != "" {
		return answer{status: http.StatusBadRequest, reason: t.refuse(reason)}, nil
	}
	seen := hashKey("view", cb.Team.ID, cb.User.ID, cb.View.ID, cb.View.Hash)
	fresh, err := t.core.MarkSeen(ctx, seen)
	if err != nil {
		return answer{}, err
	}
	if !fresh {
		return answer{reason: t.refuse(ReasonDuplicate)}, nil
	}
	if a, closed := t.notPending(tg, cb.User.ID); closed {
		return a, nil
	}
	// The reason is the decision's note (capped by NewDecision).
	note := ""
	if cb.View.State != nil {
		note = cb.View.State.Values[denyBlock][denyInput].Value
	}
	return answer{}, t.decideOnce(ctx, seen, cb, tg, schemas.OptionDeny, cb.View.ID+cb.View.Hash, note)
}

// decideOnce is decide for an action recorded as seen: when the publish
// fails, the record goes, so that Slack's retry of the action is handled.
func (t *Transport) decideOnce(ctx context.Context, seen string, cb *slack.InteractionCallback, tg *chat.Target, option, nonce, note string) error {
	err := t.decide(ctx, cb, tg, option, nonce, note)
	if err != nil {
		t.core.Unmark(seen)
	}
	return err
}

// decide publishes the clicking user's decision. The decider is the Slack
// user Slack authenticated (verified), the channel the prompt's: the
// approver checks who may decide.
func (t *Transport) decide(ctx context.Context, cb *slack.InteractionCallback, tg *chat.Target, option, nonce, note string) error {
	decider := schemas.Sender{ID: userTeam(cb.Team.ID, cb.User.TeamID) + ":" + cb.User.ID, Kind: schemas.SenderUser, Verified: true}
	return t.core.Publish(ctx, t.core.NewDecision(tg, decider, option, note, cb.Team.ID, cb.User.ID, tg.Rec.ApprovalID, option, nonce))
}

// DecisionPrefix starts the id of every decision the transport publishes.
const DecisionPrefix = "d-" + Name + "-"

// openView opens a modal; a failure is logged (the user can click again).
func (t *Transport) openView(ctx context.Context, trigger string, v slack.ModalViewRequest) {
	if _, err := t.cfg.API.OpenViewContext(ctx, trigger, v); err != nil {
		t.log.Warn("slack: views.open failed", "err", err)
	}
}

// ephemeral shows text to user alone in channel.
func (t *Transport) ephemeral(ctx context.Context, channel, user, text string) error {
	return t.poster.do(ctx, channel, func() error {
		_, err := t.cfg.API.PostEphemeralContext(ctx, channel, user, slack.MsgOptionText(text, false))
		return err
	})
}
