package web_test

import (
	"encoding/json"
	"html"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A call holding invisible and direction-changing characters (every row
// of reveal.HostileExamples, in argument names and values) is shown on
// its card with each escaped, none raw, and the warning; a plain call's
// card has no warning.
func TestCardShowsHostileCharactersEscaped(t *testing.T) {
	in := startInbox(t, nil)
	byName := map[string]string{}
	for _, ex := range reveal.HostileExamples {
		byName[ex.Text] = ex.Text
	}
	args, _ := json.Marshal(byName)
	a := in.request("carol", "count", string(args), false)
	plain := in.request("carol", "count", `{"path":"x/invoice.txt"}`, false)
	b := in.browser()
	list := html.UnescapeString(b.signIn("alice"))
	start := strings.Index(list, `id="row-`+a.ApprovalID+`"`)
	if start < 0 {
		t.Fatalf("no row of %s:\n%s", a.ApprovalID, list)
	}
	if row, _, _ := strings.Cut(list[start:], "</li>"); reveal.Contains(row) || !strings.Contains(row, "⚠") {
		t.Errorf("the row holds a raw flagged character or no warning sign:\n%q", row)
	}
	_, card := b.card(a.ApprovalID)
	card = html.UnescapeString(card)
	if reveal.Contains(card) || !strings.Contains(card, reveal.Warning) {
		t.Errorf("the card holds a raw flagged character or no warning:\n%q", card)
	}
	for _, ex := range reveal.HostileExamples {
		if !strings.Contains(card, "<dt>"+ex.Shown+"</dt>") {
			t.Errorf("%s: the card does not name the argument %s", ex.Name, ex.Shown)
		}
		if !strings.Contains(card, `"`+ex.InJSON()+`"`) {
			t.Errorf("%s: the card does not show the value %s", ex.Name, ex.InJSON())
		}
	}
	if _, card := b.card(plain.ApprovalID); card == "" || strings.Contains(card, reveal.Warning) {
		t.Errorf("the plain call's card is missing or warns:\n%s", card)
	}
}

// A call whose arguments are plain but whose session or channel id holds
// a character reveal escapes gets the card's warning line as well as the
// row's sign: the line names every field a person reads, not only the
// arguments (docs/inbox.md).
func TestCardWarnsOfHiddenCharactersInSessionAndChannel(t *testing.T) {
	in := startInbox(t, nil)
	hidden := reveal.HostileExamples[0]
	for _, tc := range []struct {
		name    string
		session string
		channel string
	}{
		{"only the session id holds one", in.NextID("s") + hidden.Text, ""},
		{"only the channel id holds one", in.NextID("s"), "room" + hidden.Text},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := in.Inbound(tc.session, "carol", pipelinetest.Call("count", `{"path":"x/plain.txt"}`))
			if tc.channel != "" {
				m.Channel = schemas.Channel{ID: tc.channel, Kind: schemas.ChannelPrivate}
			}
			rec := in.WaitPending(schemas.ApprovalID(in.Send(m), 0))
			b := in.browser()
			b.signIn("alice")
			_, card := b.card(rec.ApprovalID)
			card = html.UnescapeString(card)
			if card == "" {
				t.Fatalf("no card for %s", rec.ApprovalID)
			}
			if reveal.Contains(card) {
				t.Errorf("the card holds a raw flagged character:\n%q", card)
			}
			if !strings.Contains(card, reveal.Warning) {
				t.Errorf("the card has no warning line:\n%q", card)
			}
			if !strings.Contains(card, hidden.Shown) {
				t.Errorf("the card does not show the escape %s:\n%q", hidden.Shown, card)
			}
		})
	}
}
