package slack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
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

// target is a checked click: the approval and its prompt.
type target struct {
	rec    *schemas.ApprovalRecord
	prompt *post
}

// check binds a click to an approval: value names it and its digest, and
// the clicked message (channel, ts) is its prompt.
func (t *Transport) check(ctx context.Context, value, channel, ts string) (*target, string, error) {
	id, digest, ok := parseValue(value)
	if !ok {
		return nil, ReasonActionMismatch, nil
	}
	p, _, err := t.getPost(ctx, promptKey(id))
	if err != nil {
		return nil, "", err
	}
	if p == nil || p.Channel != channel || p.TS != ts || p.Digest != digest {
		return nil, ReasonActionMismatch, nil
	}
	rec, err := t.approval(ctx, id)
	if err != nil {
		return nil, "", err
	}
	if rec == nil || rec.ArgsDigest != digest {
		return nil, ReasonActionMismatch, nil
	}
	return &target{rec: rec, prompt: p}, "", nil
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
		return answer{after: func(ctx context.Context) { t.openView(ctx, trigger, argsView(tg.rec)) }}, nil
	}
	if isGrant && !tg.rec.Offers(grant) {
		// A grant option the prompt did not offer (the approver would
		// refuse it too): nothing is published.
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}, nil
	}
	seen := hashKey("action", cb.Team.ID, cb.User.ID, act.ActionID, act.ActionTs, cb.Container.MessageTs)
	fresh, err := t.markSeen(ctx, seen)
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
		meta := buttonValue(tg.rec.ApprovalID, tg.rec.ArgsDigest) + " " + tg.prompt.Channel + " " + tg.prompt.TS
		return answer{after: func(ctx context.Context) { t.openView(ctx, trigger, denyView(tg.rec, meta)) }}, nil
	}
	return answer{}, t.decideOnce(ctx, seen, cb, tg, schemas.OptionApprove, act.ActionTs, "")
}

// notPending answers a click on an approval that can no longer be
// decided: an ephemeral message with the code, nothing published.
func (t *Transport) notPending(tg *target, user string) (answer, bool) {
	code := schemas.Code("")
	switch {
	case tg.rec.Status == schemas.ApprovalExpired,
		tg.rec.Status == schemas.ApprovalPending && !tg.rec.ExpiresAt.IsZero() && !t.cfg.Now().Before(tg.rec.ExpiresAt):
		code = schemas.CodeApprovalExpired
	case tg.rec.Status != schemas.ApprovalPending:
		code = schemas.CodeApprovalAlreadyDecided
	default:
		return answer{}, false
	}
	t.refuse(ReasonNotPending)
	channel := tg.prompt.Channel
	return answer{reason: ReasonNotPending, after: func(ctx context.Context) {
		err := t.ephemeral(ctx, channel, user, string(code)+": this approval can no longer be decided ("+string(tg.rec.Status)+").")
		if err != nil {
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
	fresh, err := t.markSeen(ctx, seen)
	if err != nil {
		return answer{}, err
	}
	if !fresh {
		return answer{reason: t.refuse(ReasonDuplicate)}, nil
	}
	if a, closed := t.notPending(tg, cb.User.ID); closed {
		return a, nil
	}
	note := ""
	if cb.View.State != nil {
		note = cb.View.State.Values[denyBlock][denyInput].Value
	}
	if len(note) > schemas.MaxNoteBytes {
		note = note[:schemas.MaxNoteBytes]
	}
	return answer{}, t.decideOnce(ctx, seen, cb, tg, schemas.OptionDeny, cb.View.ID+cb.View.Hash, note)
}

// decideOnce is decide for an action recorded as seen: when the publish
// fails, the record goes, so that Slack's retry of the action is handled.
func (t *Transport) decideOnce(ctx context.Context, seen string, cb *slack.InteractionCallback, tg *target, option, nonce, note string) error {
	err := t.decide(ctx, cb, tg, option, nonce, note)
	if err != nil {
		t.unmarkSeen(seen)
	}
	return err
}

// decide publishes the clicking user's decision. The decider is the Slack
// user Slack authenticated (verified), the channel the prompt's: the
// approver checks who may decide.
func (t *Transport) decide(ctx context.Context, cb *slack.InteractionCallback, tg *target, option, nonce, note string) error {
	h := sha256.Sum256([]byte(cb.Team.ID + "\x00" + cb.User.ID + "\x00" + tg.rec.ApprovalID + "\x00" + option + "\x00" + nonce))
	d := &schemas.Decision{
		DecisionID: DecisionPrefix + hex.EncodeToString(h[:12]),
		ApprovalID: tg.rec.ApprovalID,
		Transport:  Name,
		Decider:    schemas.Sender{ID: userTeam(cb.Team.ID, cb.User.TeamID) + ":" + cb.User.ID, Kind: schemas.SenderUser, Verified: true},
		Channel:    &schemas.Channel{ID: tg.prompt.Channel, Kind: tg.prompt.Kind},
		Option:     option,
		ArgsDigest: tg.rec.ArgsDigest,
		Note:       note,
		SentAt:     t.cfg.Now().UTC(),
	}
	return bus.Publish(ctx, t.cfg.JS, topology.DecisionSubject(Name, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), d)
}

// DecisionPrefix starts the id of every decision the transport publishes.
const DecisionPrefix = "d-slack-"

// openView opens a modal; a failure is logged (the user can click again).
func (t *Transport) openView(ctx context.Context, trigger string, v slack.ModalViewRequest) {
	if _, err := t.cfg.API.OpenViewContext(ctx, trigger, v); err != nil {
		t.log.Warn("slack: views.open failed", "err", err)
	}
}

// ephemeral shows text to user alone in channel.
func (t *Transport) ephemeral(ctx context.Context, channel, user, text string) error {
	err := t.poster.do(ctx, channel, func() error {
		_, err := t.cfg.API.PostEphemeralContext(ctx, channel, user, slack.MsgOptionText(text, false))
		return err
	})
	if err == nil {
		t.delivered.WithLabelValues("rejection").Inc()
	}
	return err
}
