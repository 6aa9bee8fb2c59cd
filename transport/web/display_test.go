package web_test

import (
	"encoding/json"
	"html"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/reveal"
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
