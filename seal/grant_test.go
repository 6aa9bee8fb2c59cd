package seal_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

func TestGrantMAC(t *testing.T) {
	ring, err := seal.NewFile("k1").Ring()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := seal.NewFile("k1").Ring()
	tc := &schemas.TurnContext{V: 1, SessionID: "s", TurnID: "t-1", Transport: "cli", Audience: schemas.AudiencePersonal, TrustBoundary: "local",
		Requester: schemas.Requester{Principal: "cli:a", SenderID: "a", Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: "dm", Kind: schemas.ChannelDM}}
	if err := ring.Seal(tc); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	mk := func() *schemas.Grant {
		g := &schemas.Grant{GrantID: "g-1", Option: "approve-s", Effect: schemas.ApprovalApproved, Tool: "t",
			Scope: schemas.GrantScope{Kind: schemas.GrantScopeSession, SessionID: "s"}, Principal: "cli:a", Context: tc,
			ApprovalID: "a-1", DecisionID: "d-1", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := ring.SealGrant(g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	if err := ring.VerifyGrant(mk()); err != nil {
		t.Fatalf("verify: %v", err)
	}
	// The revocation is outside the MAC; a round trip through the codec keeps it valid.
	g := mk()
	g.Revoked = &schemas.GrantRevocation{By: "ops", At: now}
	b, err := schemas.Encode(g)
	if err != nil {
		t.Fatal(err)
	}
	back, err := schemas.Decode[schemas.Grant](b)
	if err != nil || ring.VerifyGrant(back) != nil {
		t.Fatalf("round trip: %v / %v", err, ring.VerifyGrant(back))
	}
	for name, edit := range map[string]func(*schemas.Grant){
		"no mac":           func(g *schemas.Grant) { g.MAC = nil },
		"scope widened":    func(g *schemas.Grant) { g.Scope.Kind = schemas.GrantScopeRequester },
		"expiry moved":     func(g *schemas.Grant) { g.ExpiresAt = g.ExpiresAt.Add(time.Hour) },
		"tool swapped":     func(g *schemas.Grant) { g.Tool = "rm" },
		"principal":        func(g *schemas.Grant) { g.Principal = "cli:b" },
		"effect":           func(g *schemas.Grant) { g.Option, g.Effect = "deny-s", schemas.ApprovalDenied },
		"unknown key":      func(g *schemas.Grant) { g.MAC.KeyID = "k9" },
		"context tampered": func(g *schemas.Grant) { c := *g.Context; c.Audience = schemas.AudiencePublic; g.Context = &c },
		"context unsealed": func(g *schemas.Grant) { c := *g.Context; c.Seal = nil; g.Context = &c },
	} {
		t.Run(name, func(t *testing.T) {
			g := mk()
			edit(g)
			if err := ring.VerifyGrant(g); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
				t.Fatalf("verify: %v", err)
			}
		})
	}
	t.Run("another ring's MAC", func(t *testing.T) {
		if err := other.VerifyGrant(mk()); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
			t.Fatalf("verify: %v", err)
		}
	})
	t.Run("a grant on an unauthenticated turn is not sealed", func(t *testing.T) {
		c := *tc
		c.Seal = nil
		g := &schemas.Grant{GrantID: "g-2", Context: &c}
		if err := ring.SealGrant(g); err == nil || g.MAC != nil {
			t.Fatalf("sealed: %v", err)
		}
	})
}
