package slack

import (
	"fmt"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// FoldArgs is how many bytes of a call's arguments a prompt shows inline;
// longer arguments are folded, the full text one click away (a modal).
const FoldArgs = 600

// maxModalText is Slack's limit on a section's text.
const maxModalText = 3000

func mrkdwn(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
}
func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

// escape makes user-controlled text inert in mrkdwn (no mentions, links):
// & < > as Slack's docs say (https://api.slack.com/reference/surfaces/formatting#escaping).
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// shown is a call's plain-text field (a principal, a summary) as a
// decider is shown it: reveal's rule, then escaped.
func shown(s string) string { return escape(reveal.Must(s)) }

// code formats s as a code block that s cannot close (chat.CodeBody).
func code(s string) string {
	return "```" + chat.CodeBody(escape(s)) + "```"
}

// warningBlock is the line a prompt shows when its call contains a
// character reveal escapes.
func warningBlock() slack.Block {
	return slack.NewContextBlock("tollgate_reveal", mrkdwn(":warning: *"+escape(reveal.Warning)+"*"))
}

// promptBlocks renders a pending approval: tool, arguments (folded when
// long), digest, requester, expiry, and the buttons.
func promptBlocks(rec *schemas.ApprovalRecord) []slack.Block {
	requester := ""
	if rec.Context != nil {
		requester = rec.Context.Requester.Principal
	}
	all, flagged := reveal.JSON(rec.Args)
	requesterFlagged := reveal.Contains(requester)
	args, folded := chat.Truncate(all, FoldArgs)
	if folded {
		args += " …"
	}
	value := buttonValue(rec.ApprovalID, rec.ArgsDigest)
	blocks := []slack.Block{
		slack.NewSectionBlock(mrkdwn(fmt.Sprintf("*Approval needed:* `%s`\n%s", escape(rec.Tool), code(args))), nil, nil),
		slack.NewContextBlock("", mrkdwn(fmt.Sprintf("digest `%s` · requested by %s · expires %s · %s",
			escape(rec.ArgsDigest), shown(requester), chat.Expiry(rec), escape(rec.ApprovalID)))),
	}
	// What the call would change, in short (the preview's summary: "+3 -1
	// lines", "new file, 4 lines", "preview timed out"); the whole
	// preview, with the time it was taken, is on the web card. The
	// summary's words may be a tool's, so they are shown as any plain-text
	// field is.
	if sum := rec.Preview.Summary(); sum != "" {
		blocks = append(blocks, slack.NewContextBlock("", mrkdwn("change: "+shown(sum))))
	}
	if flagged || requesterFlagged {
		blocks = append(blocks, warningBlock())
	}
	var buttons []slack.BlockElement
	for _, o := range rec.Options {
		switch o {
		case schemas.OptionApprove:
			buttons = append(buttons, slack.NewButtonBlockElement(ActionApprove, value, plain("Approve")).WithStyle(slack.StylePrimary))
		case schemas.OptionDeny:
			buttons = append(buttons, slack.NewButtonBlockElement(ActionDeny, value, plain("Deny…")).WithStyle(slack.StyleDanger))
		}
	}
	if folded {
		buttons = append(buttons, slack.NewButtonBlockElement(ActionArgs, value, plain("Show full arguments")))
	}
	blocks = append(blocks, slack.NewActionBlock("tollgate_prompt", buttons...))
	// Each grant option: what it would cover and for how long (the
	// offer's summary), with its own button (ActionGrantPrefix + option).
	for _, o := range rec.Options {
		offer, ok := rec.Offer(o)
		if !ok || !schemas.IsGrantOption(o) {
			continue
		}
		label, _ := chat.Truncate(o, 75)
		b := slack.NewButtonBlockElement(ActionGrantPrefix+o, value, plain(label))
		if offer.Effect == schemas.ApprovalDenied {
			b = b.WithStyle(slack.StyleDanger)
		}
		text, _ := chat.Truncate(fmt.Sprintf("*%s*: %s", escape(o), shown(offer.Summary)), maxModalText)
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn(text), nil, slack.NewAccessory(b), slack.SectionBlockOptionBlockID("tollgate_grant_"+o)))
	}
	return blocks
}

// closedBlocks renders a prompt that can no longer be answered: no
// buttons, its status, who decided and when, and the decider's note
// (escaped, in a code block: inert).
func closedBlocks(p *chat.Record, status schemas.ApprovalStatus, d *schemas.DecisionInfo, at time.Time) []slack.Block {
	who, at, note := chat.Decided(d, at)
	blocks := []slack.Block{
		slack.NewSectionBlock(mrkdwn(fmt.Sprintf("*%s:* `%s`", chat.StatusWord(status), escape(p.Tool))), nil, nil),
		slack.NewContextBlock("", mrkdwn(fmt.Sprintf("%s by %s at %s · digest `%s` · %s",
			status, shown(who), at.UTC().Format(time.RFC3339), escape(p.Digest), escape(p.ApprovalID)))),
	}
	if note != "" {
		// Cut after escaping, so no entity or fence is left open.
		body := chat.Fold(chat.CodeBody(escape(reveal.Must(note))), maxModalText-64)
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn("*Note:* ```"+body+"```"), nil, nil))
	}
	return blocks
}

// argsView is the modal with a call's full arguments.
func argsView(rec *schemas.ApprovalRecord) slack.ModalViewRequest {
	var blocks []slack.Block
	rest, flagged := reveal.JSON(rec.Args)
	if flagged {
		blocks = append(blocks, warningBlock())
	}
	for rest != "" {
		var part string
		part, _ = chat.Truncate(rest, maxModalText-64)
		rest = rest[len(part):]
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn(code(part)), nil, nil))
	}
	return slack.ModalViewRequest{
		Type: slack.VTModal, Title: plain("Arguments"), Close: plain("Close"),
		Blocks: slack.Blocks{BlockSet: append([]slack.Block{
			slack.NewContextBlock("", mrkdwn(fmt.Sprintf("`%s` · digest `%s`", escape(rec.Tool), escape(rec.ArgsDigest)))),
		}, blocks...)},
	}
}

// denyView is the modal asking for a reason to deny; meta binds it to the
// approval, its digest and its prompt.
func denyView(rec *schemas.ApprovalRecord, meta string) slack.ModalViewRequest {
	input := slack.NewPlainTextInputBlockElement(plain("Why?"), denyInput)
	input.Multiline = true
	reason := slack.NewInputBlock(denyBlock, plain("Reason"), nil, input)
	reason.Optional = true
	return slack.ModalViewRequest{
		Type: slack.VTModal, Title: plain("Deny"), Submit: plain("Deny"), Close: plain("Cancel"),
		CallbackID: ViewDeny, PrivateMetadata: meta,
		Blocks: slack.Blocks{BlockSet: []slack.Block{
			slack.NewSectionBlock(mrkdwn(fmt.Sprintf("Deny `%s`?", escape(rec.Tool))), nil, nil),
			reason,
		}},
	}
}

// outcomeText renders a turn's results (chat.OutcomeText): outputs
// folded at 1000 bytes in code blocks, the whole within 39000 bytes.
func outcomeText(o *schemas.TurnOutcome) string {
	s, _ := chat.Truncate(chat.OutcomeText(o, chat.Markup{
		Bold:     func(s string) string { return "*" + s + "*" },
		Name:     func(s string) string { return "`" + escape(s) + "`" },
		Block:    func(s string) string { return " " + code(s) },
		BlockMax: 1000,
	}), 39000)
	return s
}
