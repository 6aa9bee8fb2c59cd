package web_test

import (
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// grantOf waits for approval id to be decided and returns the id of the
// grant its decision made.
func (in *inbox) grantOf(id string) string {
	in.t.Helper()
	rec := in.WaitApproval(id, "decided", func(r *schemas.ApprovalRecord) bool { return r.Status.Decided() && r.Decision != nil })
	gid := schemas.GrantID(id, rec.Decision.DecisionID)
	jstest.Eventually(in.t, pipelinetest.Wait, "grant "+gid, func() bool { return in.grant(gid) != nil })
	return gid
}

// grant reads grant id, or nil.
func (in *inbox) grant(id string) *schemas.Grant {
	ctx, cancel := in.Ctx()
	defer cancel()
	g, _, err := in.Store.Grants.Get(ctx, id)
	if err != nil {
		return nil
	}
	return g
}

// decidedByGrant waits for turn's one call to be decided by grant gid
// (no prompt) and run.
func (in *inbox) decidedByGrant(t *testing.T, turn, gid string) {
	t.Helper()
	out := in.WaitOutcome(turn)
	rec := in.Approval(schemas.ApprovalID(turn, 0))
	if out.State != schemas.TurnCompleted || rec.Decision == nil || rec.Decision.Grant == nil || rec.Decision.Grant.GrantID != gid {
		t.Fatalf("turn %s: outcome %s, decision %+v: want completed, decided by grant %s", turn, out.State, rec.Decision, gid)
	}
}

// revoke posts the revoke form of grant id with csrf.
func (b *browser) revoke(id, csrf string) (*http.Response, string) {
	b.in.t.Helper()
	return b.do("POST", "/grants/"+id+"/revoke", url.Values{"csrf": {csrf}, "reason": {"from the test"}})
}

// TestGrantOptionsAndTheGrantsPage: the card shows each grant offer's
// summary as its own button, beside approve and deny, in the same form
// (digest and CSRF); choosing one decides the approval and makes a grant
// that decides the next covered call of the session with no prompt; the
// Grants page lists it (scope, expiry, uses) to its maker and to the
// tool's other deciders of that turn, to nobody else; the refused
// revocations (forged or another session's CSRF token, a person who may
// not decide the tool, a decider of team turns on a personal turn's
// grant, signed out, unknown ids) leave it live; a decider revokes it
// through the path of `tollgate grants revoke` (grant.revoked event, by
// web:<subject>), the page shows it revoked without a Revoke button, and
// the next call of the session prompts again.
func TestGrantOptionsAndTheGrantsPage(t *testing.T) {
	in := startInbox(t, func(c *web.Config) { c.SessionTTL = time.Hour })
	session := in.NextID("s")
	a := in.WaitPending(schemas.ApprovalID(in.send(session, "carol", "files", `{"path":"notes/a.txt"}`, true), 0))
	if len(a.Grants) != 3 {
		t.Fatalf("offers %+v", a.Grants)
	}
	alice := in.browser()
	alice.signIn("alice")
	_, card := alice.card(a.ApprovalID)
	for _, o := range a.Grants {
		if !strings.Contains(card, `name="option" value="`+o.Option+`" class="grant grant-`+string(o.Effect)+`"`) || !strings.Contains(card, template.HTMLEscapeString(o.Summary)) {
			t.Errorf("the card lacks the button of %s with its summary %q", o.Option, o.Summary)
		}
	}
	if !strings.Contains(card, "notes/") || !strings.Contains(card, "1h0m0s") || strings.Count(card, `<form `) != 1 || strings.Count(card, `name="digest"`) != 1 {
		t.Fatalf("the offers do not say what they cover and for how long, or are not in the one decision form:\n%s", card)
	}
	if i, j := strings.Index(card, `value="deny"`), strings.Index(card, `value="approve-session"`); i < 0 || j < i {
		t.Fatal("the grant buttons are not after approve and deny")
	}

	t.Run("a grant option with another approval's digest is refused", func(t *testing.T) {
		y := in.request("carol", "files", `{"path":"notes/b.txt"}`, true)
		resp, _ := alice.decide(a.ApprovalID, "approve-session", y.ArgsDigest)
		if resp.StatusCode != http.StatusConflict || in.webDecisions(a.ApprovalID) != 0 {
			t.Fatalf("%d, %d decisions", resp.StatusCode, in.webDecisions(a.ApprovalID))
		}
	})
	resp, body := alice.decide(a.ApprovalID, "approve-session", a.ArgsDigest)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Tollgate-Verdict") != web.VerdictApplied || !strings.Contains(body, "Your approve-session was applied") {
		t.Fatalf("approve-session: %d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Verdict"), body)
	}
	gid := in.grantOf(a.ApprovalID)
	if g := in.grant(gid); g.Principal != "web:alice" || g.Scope.SessionID != session {
		t.Fatalf("grant %+v", g)
	}
	second := in.send(session, "carol", "files", `{"path":"other/x.txt"}`, true)
	in.decidedByGrant(t, second, gid)

	// A grant of alice's on a personal turn: bob does not decide those.
	pa := in.request("carol", "files", `{"path":"notes/p.txt"}`, false)
	if resp, _ := alice.decide(pa.ApprovalID, "approve-folder", pa.ArgsDigest); resp.StatusCode != http.StatusOK {
		t.Fatalf("approve-folder: %d", resp.StatusCode)
	}
	personal := in.grantOf(pa.ApprovalID)

	for _, tc := range []struct {
		who       string
		see, not  []string
		revokable []string
	}{
		{"alice", []string{gid, personal}, nil, []string{gid, personal}},
		{"bob", []string{gid}, []string{personal}, []string{gid}},
		{"mallory", nil, []string{gid, personal}, nil},
	} {
		t.Run("the Grants page of "+tc.who, func(t *testing.T) {
			b := in.browser()
			b.signIn(tc.who)
			resp, page := b.do("GET", "/grants", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d", resp.StatusCode)
			}
			for _, id := range tc.see {
				if !strings.Contains(page, `data-grant="`+id+`" data-state="live"`) {
					t.Errorf("%s is not listed live", id)
				}
			}
			for _, id := range tc.not {
				if strings.Contains(page, id) {
					t.Errorf("%s is shown", id)
				}
			}
			for _, id := range tc.revokable {
				if !strings.Contains(page, `action="/grants/`+id+`/revoke"`) {
					t.Errorf("%s has no Revoke button", id)
				}
			}
			if len(tc.see) == 0 && !strings.Contains(page, "No grants.") {
				t.Error("the page does not say there are none")
			}
		})
	}
	t.Run("the page says what a grant covers and how often it was used", func(t *testing.T) {
		jstest.Eventually(t, pipelinetest.Wait, "one use shown", func() bool {
			_, page := alice.do("GET", "/grants", nil)
			row := page[strings.Index(page, `id="`+gid+`"`):]
			return strings.Contains(row, `<dd class="uses">1</dd>`) && strings.Contains(row, "session "+session) &&
				strings.Contains(row, template.HTMLEscapeString(in.grant(gid).Summary))
		})
	})
	t.Run("signed out, the page sends to sign-in", func(t *testing.T) {
		b := in.browser()
		resp, _ := b.do("GET", "/grants", nil)
		if resp.Request.URL.Path != "/signin" {
			t.Fatalf("ended at %s", resp.Request.URL.Path)
		}
	})

	for _, tc := range []struct {
		name   string
		setup  func(b *browser) (id, csrf string)
		status int
		code   schemas.Code
	}{
		{"a forged CSRF token", func(b *browser) (string, string) {
			return gid, strings.Repeat("A", len(b.token()))
		}, http.StatusForbidden, web.CodeCSRFInvalid},
		{"another session's CSRF token", func(b *browser) (string, string) {
			other := in.browser()
			other.signIn("alice")
			return gid, other.token()
		}, http.StatusForbidden, web.CodeCSRFInvalid},
		{"a person who may not decide the tool", func(b *browser) (string, string) {
			b.signIn("mallory")
			return gid, b.token()
		}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
		{"another principal's grant on a turn they may not decide", func(b *browser) (string, string) {
			b.signIn("bob")
			return personal, b.token()
		}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
		{"signed out, replaying the old cookie", func(b *browser) (string, string) {
			old := b.jar.Cookies(mustURL(in.url))
			csrf := b.token()
			b.do("POST", "/signout", url.Values{"csrf": {csrf}})
			b.jar.SetCookies(mustURL(in.url), old)
			return gid, csrf
		}, http.StatusUnauthorized, web.CodeSignedOut},
		{"an unknown grant", func(b *browser) (string, string) {
			return "g-00000000000000000000000000000000", b.token()
		}, http.StatusNotFound, web.CodeGrantNotFound},
		{"an index record's key", func(b *browser) (string, string) {
			return schemas.GrantIndexKey("files", "cli:carol"), b.token()
		}, http.StatusNotFound, web.CodeGrantNotFound},
	} {
		t.Run("revoke refused: "+tc.name, func(t *testing.T) {
			b := in.browser()
			b.signIn("alice")
			id, csrf := tc.setup(b)
			resp, body := b.revoke(id, csrf)
			if resp.StatusCode != tc.status || resp.Header.Get("Tollgate-Code") != string(tc.code) {
				t.Fatalf("%d %s, want %d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Code"), tc.status, tc.code, body)
			}
			for _, g := range []string{gid, personal} {
				if in.grant(g).Revoked != nil || len(in.Events(topology.GrantEventSubject(schemas.GrantRevoked, g))) != 0 {
					t.Fatalf("grant %s was revoked", g)
				}
			}
		})
	}

	t.Run("a decider of the turn revokes another principal's grant; the next call prompts again", func(t *testing.T) {
		bob := in.browser()
		bob.signIn("bob")
		bob.do("GET", "/grants", nil)
		resp, page := bob.revoke(gid, bob.token())
		if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/grants" {
			t.Fatalf("revoke: %d at %s\n%s", resp.StatusCode, resp.Request.URL, page)
		}
		g := in.grant(gid)
		if g.Revoked == nil || g.Revoked.By != "web:bob" || g.Revoked.Reason != "from the test" {
			t.Fatalf("revocation %+v", g.Revoked)
		}
		evs := pipelinetest.DecodeAll[schemas.GrantEvent](t, in.Events(topology.GrantEventSubject(schemas.GrantRevoked, gid)))
		if len(evs) != 1 || evs[0].By != "web:bob" {
			t.Fatalf("revoked events %+v", evs)
		}
		if !strings.Contains(page, `data-grant="`+gid+`" data-state="revoked"`) || strings.Contains(page, `action="/grants/`+gid+`/revoke"`) || !strings.Contains(page, "by web:bob") {
			t.Fatalf("the page does not show it revoked:\n%s", page)
		}
		if strings.Contains(page, personal) {
			t.Fatal("bob sees the personal grant")
		}
		runs := in.files.Runs(schemas.CallID(second, 0))
		third := in.send(session, "carol", "files", `{"path":"other/y.txt"}`, true)
		if rec := in.WaitPending(schemas.ApprovalID(third, 0)); rec.Decision != nil {
			t.Fatalf("third call decided by %+v", rec.Decision)
		}
		if in.files.Runs(schemas.CallID(second, 0)) != runs {
			t.Fatal("the second call ran again")
		}
		_, page = alice.do("GET", "/grants", nil)
		if n := in.Metric("tollgate_grants_revoked_total", nil); n != 1 {
			t.Fatalf("tollgate_grants_revoked_total = %v, want 1", n)
		}
		if resp, _ := bob.revoke(gid, bob.token()); resp.StatusCode != http.StatusOK || in.Metric("tollgate_grants_revoked_total", nil) != 1 {
			t.Fatalf("revoking again: %d, counted %v times", resp.StatusCode, in.Metric("tollgate_grants_revoked_total", nil))
		}
		if i, j := strings.Index(page, `data-grant="`+personal+`" data-state="live"`), strings.Index(page, `data-grant="`+gid+`" data-state="revoked"`); i < 0 || j < 0 || i > j {
			t.Fatal("alice's page does not list the live grant before the revoked one")
		}
	})
	t.Run("the maker revokes their own grant", func(t *testing.T) {
		if resp, _ := alice.revoke(personal, alice.token()); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d", resp.StatusCode)
		}
		if g := in.grant(personal); g.Revoked == nil || g.Revoked.By != "web:alice" {
			t.Fatalf("revocation %+v", g.Revoked)
		}
	})
}
