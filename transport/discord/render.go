package discord

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// FoldArgs is how many bytes of a call's arguments a prompt shows inline;
// longer arguments are folded, the full text one click away (the Show
// arguments button answers it ephemerally).
const FoldArgs = 600

// maxContent is Discord's limit on a message's content (characters; bytes
// here, which is stricter).
const maxContent = 2000

// Button verbs, the first part of a prompt button's custom_id
// "<verb>:<approval id>:<digest prefix>".
const (
	VerbApprove = "tg-approve"
	VerbDeny    = "tg-deny"
	VerbArgs    = "tg-args"
	// VerbDenyReason opens a modal asking for a reason; its submit (the
	// modal's custom_id carries the same verb) denies with the reason as
	// the decision's note.
	VerbDenyReason = "tg-denyr"
	// VerbGrantPrefix + i is the verb of the button of the grant option
	// at index i of the approval's Options ("tg-g2"): the index, not the
	// option's name, keeps the custom_id within Discord's 100 characters.
	VerbGrantPrefix = "tg-g"
)

// maxGrantButtons is how many grant options a prompt shows (one action
// row).
const maxGrantButtons = 5

// grantVerb is the verb of the button of the option at index i.
func grantVerb(i int) string { return VerbGrantPrefix + strconv.Itoa(i) }

// GrantOptionOf returns the grant option a grant button's verb names on
// rec: ok only for an index of rec.Options holding a grant option that
// the prompt describes (rec.Grants).
func GrantOptionOf(verb string, rec *schemas.ApprovalRecord) (string, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(verb, VerbGrantPrefix))
	if !strings.HasPrefix(verb, VerbGrantPrefix) || err != nil || n < 0 || n >= len(rec.Options) || grantVerb(n) != verb {
		return "", false
	}
	o := rec.Options[n]
	if _, ok := rec.Offer(o); !ok || !schemas.IsGrantOption(o) {
		return "", false
	}
	return o, true
}

// digestPrefix is how much of the digest a custom_id carries: Discord
// allows 100 characters, and the clicked message is checked as well.
const digestPrefix = 40

// customID is a prompt button's custom_id.
func customID(verb string, rec *schemas.ApprovalRecord) string {
	d, _ := truncate(rec.ArgsDigest, digestPrefix)
	return verb + ":" + rec.ApprovalID + ":" + d
}

// parseCustomID splits a custom_id; ok is false for one Tollgate never sent.
func parseCustomID(s string) (verb, approvalID, digest string, ok bool) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	switch n, err := strconv.Atoi(strings.TrimPrefix(parts[0], VerbGrantPrefix)); {
	case parts[0] == VerbApprove, parts[0] == VerbDeny, parts[0] == VerbDenyReason, parts[0] == VerbArgs:
	case strings.HasPrefix(parts[0], VerbGrantPrefix) && err == nil && grantVerb(n) == parts[0]:
	default:
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], schemas.ValidKey(parts[1]) && parts[2] != ""
}

// outgoing is a message Tollgate sends (POST, PATCH or an interaction
// answer's data). Mentions never ping anyone.
type outgoing struct {
	Content         string          `json:"content"`
	Components      []component     `json:"components"`
	Flags           int             `json:"flags,omitempty"`
	AllowedMentions allowedMentions `json:"allowed_mentions"`
}

type allowedMentions struct {
	Parse []string `json:"parse"`
}

// component is an action row (type 1), a button (type 2) or a text
// input (type 4, in a modal).
type component struct {
	Type       int         `json:"type"`
	Style      int         `json:"style,omitempty"`
	Label      string      `json:"label,omitempty"`
	CustomID   string      `json:"custom_id,omitempty"`
	Components []component `json:"components,omitempty"`
	// Text inputs only.
	Required  *bool `json:"required,omitempty"`
	MaxLength int   `json:"max_length,omitempty"`
}

// modal is a modal answer's data (type 9): a title and text inputs.
type modal struct {
	CustomID   string      `json:"custom_id"`
	Title      string      `json:"title"`
	Components []component `json:"components"`
}

// modalReason is the custom_id of the deny modal's reason input.
const modalReason = "reason"

// denyModal asks for the reason to deny rec: an optional paragraph of at
// most schemas.MaxNoteBytes characters (the note is cut to as many bytes
// too). Its custom_id binds it to the approval and digest, as a button's.
func denyModal(rec *schemas.ApprovalRecord) *modal {
	title, _ := truncate("Deny "+rec.Tool, 45)
	optional := false
	return &modal{CustomID: customID(VerbDenyReason, rec), Title: title, Components: []component{{Type: 1, Components: []component{
		{Type: 4, Style: 2, Label: "Reason", CustomID: modalReason, Required: &optional, MaxLength: min(schemas.MaxNoteBytes, 4000)},
	}}}}
}

// flagEphemeral shows an interaction answer to its user alone.
const flagEphemeral = 64

func text(s string) *outgoing {
	s, _ = truncate(s, maxContent)
	return &outgoing{Content: s, Components: []component{}, AllowedMentions: allowedMentions{Parse: []string{}}}
}

func ephemeral(s string) *outgoing {
	m := text(s)
	m.Flags = flagEphemeral
	return m
}

// code formats s as a code block that s cannot close (chat.CodeBody).
func code(s string) string {
	return "```\n" + chat.CodeBody(s) + "\n```"
}

// warning is the line a message shows when its call contains a character
// reveal escapes.
const warning = "\n⚠ **" + reveal.Warning + "**"

// replyText is the planner's reply as posted: a masked link [text](url)
// cannot render (its "](" is broken by a backslash), so no link is
// disguised; mentions are suppressed by allowed_mentions.
func replyText(s string) string { return strings.ReplaceAll(s, "](", `]\(`) }

// inline formats s as inline code.
func inline(s string) string { return "`" + strings.ReplaceAll(s, "`", "'") + "`" }

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) (string, bool) { return chat.Truncate(s, n) }

// promptMessage renders a pending approval: tool, arguments (folded when
// long), digest, requester, expiry, and the buttons.
func promptMessage(rec *schemas.ApprovalRecord) *outgoing {
	requester := ""
	if rec.Context != nil {
		requester = rec.Context.Requester.Principal
	}
	all, flagged := reveal.JSON(rec.Args)
	who, whoFlagged := reveal.String(requester)
	args, folded := truncate(all, FoldArgs)
	if folded {
		args += " …"
	}
	warn := ""
	if flagged || whoFlagged {
		warn = warning
	}
	// What the call would change, in short (the preview's summary; the
	// whole preview, with the time it was taken, is on the web card). Its
	// words may be a tool's, so they are revealed and quoted like the
	// requester.
	change := ""
	if sum := rec.Preview.Summary(); sum != "" {
		s, sumFlagged := reveal.String(sum)
		change = "\nchange: " + inline(s)
		if sumFlagged {
			warn = warning
		}
	}
	m := text(fmt.Sprintf("**Approval needed:** %s%s\n%s\ndigest %s · requested by %s · expires %s · %s%s",
		inline(rec.Tool), warn, code(args), inline(rec.ArgsDigest), inline(who), chat.Expiry(rec), inline(rec.ApprovalID), change))
	var buttons []component
	for _, o := range rec.Options {
		switch o {
		case schemas.OptionApprove:
			buttons = append(buttons, component{Type: 2, Style: 3, Label: "Approve", CustomID: customID(VerbApprove, rec)})
		case schemas.OptionDeny:
			buttons = append(buttons, component{Type: 2, Style: 4, Label: "Deny", CustomID: customID(VerbDeny, rec)},
				component{Type: 2, Style: 2, Label: "Deny with reason…", CustomID: customID(VerbDenyReason, rec)})
		}
	}
	if folded {
		buttons = append(buttons, component{Type: 2, Style: 2, Label: "Show arguments", CustomID: customID(VerbArgs, rec)})
	}
	m.Components = []component{{Type: 1, Components: buttons}}
	// Each grant option: a line saying what it would cover and for how
	// long (the offer's summary), and a button of its own.
	var grants []component
	var lines strings.Builder
	for i, o := range rec.Options {
		offer, ok := rec.Offer(o)
		if !ok || !schemas.IsGrantOption(o) || len(grants) == maxGrantButtons {
			continue
		}
		label, _ := truncate(o, 80)
		style := 3
		if offer.Effect == schemas.ApprovalDenied {
			style = 4
		}
		grants = append(grants, component{Type: 2, Style: style, Label: label, CustomID: customID(grantVerb(i), rec)})
		fmt.Fprintf(&lines, "\n%s: %s", inline(o), inline(reveal.Must(offer.Summary)))
	}
	if len(grants) > 0 {
		m.Content, _ = truncate(m.Content+"\n**Or decide and grant:**"+lines.String(), maxContent)
		m.Components = append(m.Components, component{Type: 1, Components: grants})
	}
	return m
}

// argsMessage is the full arguments of a call, shown to the clicker alone.
func argsMessage(rec *schemas.ApprovalRecord) *outgoing {
	all, flagged := reveal.JSON(rec.Args)
	args, cut := truncate(all, maxContent-300)
	if cut {
		args += " …"
	}
	warn := ""
	if flagged {
		warn = warning
	}
	return ephemeral(fmt.Sprintf("%s · digest %s%s\n%s", inline(rec.Tool), inline(rec.ArgsDigest), warn, code(args)))
}

// closedMessage renders a prompt that can no longer be answered: no
// buttons, its status, who decided and when, and the decider's note (in
// a code block it cannot close; mentions never ping).
func closedMessage(p *chat.Record, status schemas.ApprovalStatus, d *schemas.DecisionInfo, at time.Time) *outgoing {
	who, at, note := chat.Decided(d, at)
	s := fmt.Sprintf("**%s:** %s\n%s by %s at %s · digest %s · %s", chat.StatusWord(status), inline(p.Tool),
		status, inline(reveal.Must(who)), at.UTC().Format(time.RFC3339), inline(p.Digest), inline(p.ApprovalID))
	if note != "" {
		s += "\n**Note:**\n" + code(chat.Fold(reveal.Must(note), maxContent-len(s)-64))
	}
	return text(s)
}

// outcomeText renders a turn's results (chat.OutcomeText): outputs
// folded at 500 bytes in code blocks.
func outcomeText(o *schemas.TurnOutcome) string {
	return chat.OutcomeText(o, chat.Markup{
		Bold:     func(s string) string { return "**" + s + "**" },
		Name:     inline,
		Block:    func(s string) string { return "\n" + code(s) },
		BlockMax: 500,
	})
}
