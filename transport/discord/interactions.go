package discord

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Interaction checks.
const (
	// SignatureWindow is how far an interaction's timestamp may be from
	// the clock, either way.
	SignatureWindow = chat.SignatureWindow
	// answerBudget bounds the work done before an interaction is
	// answered: Discord wants an answer within 3 seconds.
	answerBudget = chat.AnswerBudget
	// ownDecisionWait is how long a click waits for its own decision to
	// be taken, to answer UPDATE_MESSAGE, before it defers.
	ownDecisionWait = 1500 * time.Millisecond
	// tokenLife is how long an interaction token may be used.
	tokenLife = 15 * time.Minute
)

// Interaction and answer types.
const (
	typePing      = 1
	typeCommand   = 2
	typeComponent = 3
	typeModal     = 5 // MODAL_SUBMIT

	answerPong           = 1
	answerMessage        = 4
	answerDeferredUpdate = 6
	answerUpdateMessage  = 7
	answerModal          = 9
)

// CommandAsk is the slash command that asks the agent.
const CommandAsk = "ask"

// Sign returns the X-Signature-Ed25519 of body at timestamp ts under key
// (hex of the Ed25519 signature of ts + body), as Discord signs.
func Sign(key ed25519.PrivateKey, ts string, body []byte) string {
	return hex.EncodeToString(ed25519.Sign(key, append([]byte(ts), body...)))
}

// user is a Discord user in an interaction.
type user struct {
	ID  string `json:"id"`
	Bot bool   `json:"bot"`
}

// interaction is the part of an interaction Tollgate reads.
type interaction struct {
	ID            string `json:"id"`
	ApplicationID string `json:"application_id"`
	Type          int    `json:"type"`
	Token         string `json:"token"`
	GuildID       string `json:"guild_id"`
	ChannelID     string `json:"channel_id"`
	Channel       *struct {
		Type int `json:"type"`
	} `json:"channel"`
	Member *struct {
		User user `json:"user"`
	} `json:"member"`
	User *user `json:"user"`
	Data struct {
		Name    string `json:"name"`
		Options []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"options"`
		CustomID string `json:"custom_id"`
		// Components of a modal submit: rows of text inputs.
		Components []struct {
			Components []struct {
				CustomID string `json:"custom_id"`
				Value    string `json:"value"`
			} `json:"components"`
		} `json:"components"`
	} `json:"data"`
	Message *message `json:"message"`
}

// who is the interaction's user: member.user in a guild, user in a DM.
func (in *interaction) who() user {
	if in.Member != nil {
		return in.Member.User
	}
	if in.User != nil {
		return *in.User
	}
	return user{}
}

// field is the value of a modal submit's text input customID.
func (in *interaction) field(customID string) string {
	for _, row := range in.Data.Components {
		for _, c := range row.Components {
			if c.CustomID == customID {
				return c.Value
			}
		}
	}
	return ""
}

// reply is an interaction answer: {"type": …, "data": …}.
type reply struct {
	Type int `json:"type"`
	Data any `json:"data,omitempty"` // *outgoing, or *modal
}

// verify reads and authenticates a request (chat.ReadSigned): a valid
// Ed25519 signature over the timestamp and body (else 401
// bad_signature) and a timestamp within SignatureWindow (else 401
// stale_timestamp).
func (t *Transport) verify(r *http.Request) (body []byte, status int, reason string) {
	return t.core.ReadSigned(r, func(body []byte) (string, bool) {
		ts := r.Header.Get("X-Signature-Timestamp")
		sig, err := hex.DecodeString(r.Header.Get("X-Signature-Ed25519"))
		return ts, err == nil && len(sig) == ed25519.SignatureSize && ts != "" &&
			ed25519.Verify(t.cfg.PublicKey, append([]byte(ts), body...), sig)
	})
}

// serveInteraction is the interactions endpoint. An error while handling
// is transient: nothing was published, and the interaction's replay record
// is removed so that it can be sent again.
func (t *Transport) serveInteraction(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), answerBudget)
	defer cancel()
	body, status, reason := t.verify(r)
	if status != 0 {
		http.Error(w, reason, status)
		return
	}
	var in interaction
	if json.Unmarshal(body, &in) != nil || in.Type == 0 {
		http.Error(w, t.refuse(ReasonMalformed), http.StatusBadRequest)
		return
	}
	if in.Type == typePing {
		writeJSON(w, reply{Type: answerPong})
		return
	}
	if in.ID == "" || !schemas.ValidKey(in.ID) || in.who().ID == "" || in.ChannelID == "" {
		http.Error(w, t.refuse(ReasonMalformed), http.StatusBadRequest)
		return
	}
	key := "ix." + in.ID
	fresh, err := t.core.MarkSeen(ctx, key)
	if err != nil {
		t.log.Warn("discord: replay record", "err", err)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if !fresh {
		http.Error(w, t.refuse(ReasonReplayed), http.StatusBadRequest)
		return
	}
	var a answer
	switch in.Type {
	case typeCommand:
		a, err = t.command(ctx, &in)
	case typeComponent, typeModal:
		a, err = t.click(ctx, &in)
	default:
		a = answer{status: http.StatusBadRequest, reason: t.refuse(ReasonUnknownAction)}
	}
	if err != nil {
		t.core.Unmark(key)
		t.log.Warn("discord: interaction failed", "err", err)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if a.status != 0 {
		http.Error(w, a.reason, a.status)
		return
	}
	writeJSON(w, a.reply)
}

// answer is the result of handling one interaction.
type answer struct {
	status int    // HTTP status of a refusal; 0 answers reply
	reason string // refusal reason
	reply  reply
}

func refusal(status int, reason string) answer { return answer{status: status, reason: reason} }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// command publishes /ask <text> as an InboundMessage and answers with the
// request echoed.
func (t *Transport) command(ctx context.Context, in *interaction) (answer, error) {
	if in.Data.Name != CommandAsk {
		return refusal(http.StatusBadRequest, t.refuse(ReasonUnknownAction)), nil
	}
	u := in.who()
	if u.Bot {
		return refusal(http.StatusBadRequest, t.refuse(ReasonBotMessage)), nil
	}
	var askText string
	for _, o := range in.Data.Options {
		if o.Name == "text" {
			_ = json.Unmarshal(o.Value, &askText)
		}
	}
	askText = strings.TrimSpace(askText)
	if askText == "" {
		return refusal(http.StatusBadRequest, t.refuse(ReasonMalformed)), nil
	}
	channelType := -1
	if in.Channel != nil {
		channelType = in.Channel.Type
	}
	kind, err := t.kinds.kind(ctx, in.GuildID, in.ChannelID, channelType)
	if err != nil {
		return answer{}, err
	}
	m := &schemas.InboundMessage{
		Transport: Name,
		MessageID: in.ID,
		SessionID: sessionID(in.ChannelID, channelType, in.ID),
		Sender:    schemas.Sender{ID: u.ID, Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: in.ChannelID, Kind: kind},
		Text:      askText,
		SentAt:    snowflakeTime(in.ID),
	}
	if t.cfg.ProposeCalls != nil {
		m.Calls = t.cfg.ProposeCalls(m.Text)
	}
	if reason, err := t.core.PublishInbound(ctx, m); err != nil || reason != "" {
		if err != nil {
			return answer{}, err
		}
		return refusal(http.StatusBadRequest, t.refuse(reason)), nil
	}
	return answer{reply: reply{Type: answerMessage, Data: text("<@" + u.ID + "> asked: " + chat.Fold(askText, 1500))}}, nil
}

// sessionID is a request's session: a thread (a channel of its own in
// Discord) is one session; elsewhere each /ask starts its own, as a
// message that starts a thread would.
func sessionID(channel string, channelType int, interactionID string) string {
	switch channelType {
	case chanNewsThread, chanPublicThread, chanPrivateThread:
		return "discord:" + channel
	}
	return "discord:" + channel + ":" + interactionID
}

// snowflakeTime is the creation time of a Discord id.
func snowflakeTime(id string) time.Time {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(int64(n>>22) + 1420070400000).UTC()
}

// click handles a prompt button, or the submit of the deny-with-reason
// modal one opened. Before anything is published it is checked: a
// custom_id Tollgate sent (else 400 unknown_action; a modal submit only
// of the deny-with-reason modal), on the approval's own prompt with the
// approval's digest (else 400 action_mismatch), an approval still
// pending and not expired (else an ephemeral answer with the code,
// nothing published). Deny with reason answers with the modal (type 9);
// its submit denies with the reason as the decision's note.
func (t *Transport) click(ctx context.Context, in *interaction) (answer, error) {
	verb, id, digest, ok := parseCustomID(in.Data.CustomID)
	if !ok || in.Type == typeModal && verb != VerbDenyReason {
		return refusal(http.StatusBadRequest, t.refuse(ReasonUnknownAction)), nil
	}
	if in.Message == nil {
		return refusal(http.StatusBadRequest, t.refuse(ReasonActionMismatch)), nil
	}
	tg, reason, err := t.core.Check(ctx, chat.Click{ApprovalID: id, Digest: digest, Channel: in.ChannelID, MessageID: in.Message.ID, DigestPrefix: true})
	if err != nil {
		return answer{}, err
	}
	if reason != "" {
		return refusal(http.StatusBadRequest, t.refuse(reason)), nil
	}
	if verb == VerbArgs {
		return answer{reply: reply{Type: answerMessage, Data: argsMessage(tg.Rec)}}, nil
	}
	if notice, closed := t.core.Undecidable(tg.Rec); closed {
		return answer{reply: reply{Type: answerMessage, Data: ephemeral(notice)}}, nil
	}
	if verb == VerbDenyReason && in.Type == typeComponent {
		return answer{reply: reply{Type: answerModal, Data: denyModal(tg.Rec)}}, nil
	}
	option, note := schemas.OptionApprove, ""
	switch verb {
	case VerbDeny:
		option = schemas.OptionDeny
	case VerbDenyReason:
		option, note = schemas.OptionDeny, in.field(modalReason)
	}
	if strings.HasPrefix(verb, VerbGrantPrefix) {
		// A grant option's button: the option at that index of the
		// approval's options, which must be a grant option the prompt
		// offered (else nothing is published); the approver checks again.
		var ok bool
		if option, ok = GrantOptionOf(verb, tg.Rec); !ok {
			return refusal(http.StatusBadRequest, t.refuse(ReasonUnknownAction)), nil
		}
	}
	u := in.who()
	d := t.core.NewDecision(tg, schemas.Sender{ID: u.ID, Kind: schemas.SenderUser, Verified: !u.Bot}, option, note,
		u.ID, tg.Rec.ApprovalID, option, in.ID)
	// The click's token, for the approver's rejection to reach the clicker.
	ck := &chat.Record{Channel: tg.Prompt.Channel, MessageID: tg.Prompt.MessageID, App: in.ApplicationID, Token: in.Token, At: t.cfg.Now().UTC()}
	if err := t.core.PutRecord(ctx, clickKey(d.DecisionID), ck, 0); err != nil && !errors.Is(err, chat.ErrWritten) {
		return answer{}, err
	}
	if err := t.core.Publish(ctx, d); err != nil {
		return answer{}, err
	}
	if msg := t.awaitOwnDecision(ctx, tg.Prompt, d.DecisionID); msg != nil {
		return answer{reply: reply{Type: answerUpdateMessage, Data: msg}}, nil
	}
	return answer{reply: reply{Type: answerDeferredUpdate}}, nil
}

// DecisionPrefix starts the id of every decision the transport publishes.
const DecisionPrefix = "d-" + Name + "-"

// awaitOwnDecision waits briefly for the approval to be decided by
// decisionID, and returns the closed prompt (the click's UPDATE_MESSAGE),
// marking the prompt closed so that the decision's handling (its decided
// revision in the approvals bucket) does not edit it again (when that came
// first, it already did; the answer shows the same). nil: not decided by
// it in time (a rejection, another decision, or a slow approver); the
// decision closes the prompt when it is handled.
func (t *Transport) awaitOwnDecision(ctx context.Context, p *chat.Record, decisionID string) *outgoing {
	deadline := time.Now().Add(ownDecisionWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rec, err := t.core.Approval(ctx, p.ApprovalID)
		if err != nil {
			return nil
		}
		if rec != nil && rec.Status != schemas.ApprovalPending {
			if rec.Decision == nil || rec.Decision.DecisionID != decisionID {
				return nil
			}
			cur := t.core.MarkClosed(ctx, p.ApprovalID)
			if cur == nil {
				return nil
			}
			return closedMessage(cur, rec.Status, rec.Decision, rec.Decision.DecidedAt)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
