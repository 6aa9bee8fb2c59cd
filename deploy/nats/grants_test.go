package natsconf_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestGatewayUserListsGrantsAndRevokesThroughTheApprover: under the
// least-privilege accounts, the gateway user (which serves the web inbox)
// lists the standing grants, cannot write the grants bucket, and revokes a
// grant by a revocation request that the approver carries out for the
// grant's maker, and refuses, with its code, for someone else.
func TestGatewayUserListsGrantsAndRevokesThroughTheApprover(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	runStages(t, ns, t.TempDir())
	gw := dial(t, ns, "gateway")
	ctx := jstest.Ctx(t)
	keys := pipelinetest.Keys(t)

	// Two grants as the approver makes them, stored by admin: alice's and
	// carol's session grants on write_file, made in their DMs on the web.
	mk := func(sender string) *schemas.Grant {
		t.Helper()
		m := &schemas.InboundMessage{Transport: "web", MessageID: "m-" + sender, SessionID: "s-" + sender,
			Sender:  schemas.Sender{ID: sender, Kind: schemas.SenderUser, Verified: true},
			Channel: schemas.Channel{ID: "dm-" + sender, Kind: schemas.ChannelDM}, Text: "save", SentAt: time.Now().UTC(),
			Calls: []schemas.ProposedCall{{Tool: "write_file", Args: `{"content":"x","path":"notes/a.txt"}`}}}
		at, err := ingest.Accept(m, policy.Default(), schemas.Provenance{StreamSeq: 1, ReceivedAt: time.Now().UTC(), IngestedBy: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if err := keys.Seal(at.Context); err != nil {
			t.Fatal(err)
		}
		approval := schemas.ApprovalID(at.TurnID, 0)
		now := time.Now().UTC()
		g := &schemas.Grant{GrantID: schemas.GrantID(approval, "d-"+sender), Option: "approve-session", Effect: schemas.ApprovalApproved,
			Tool: "write_file", Scope: schemas.GrantScope{Kind: schemas.GrantScopeSession, SessionID: m.SessionID},
			Summary: "every write_file call in this session", Principal: "web:" + sender, Assurance: schemas.AssuranceVerified,
			Context: at.Context, ApprovalID: approval, DecisionID: "d-" + sender, PolicyVersion: policy.Default().Version(),
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := keys.SealGrant(g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	adminStore := storeOf(t, admin.js)
	alices, carols := mk("alice"), mk("carol")
	for _, g := range []*schemas.Grant{alices, carols} {
		if _, err := adminStore.Grants.Create(ctx, g.GrantID, g); err != nil {
			t.Fatal(err)
		}
	}

	gwStore := storeOf(t, gw.js)
	listed, err := grants.List(ctx, gwStore, nil)
	if err != nil {
		t.Fatalf("list as gateway: %v (server said %v)", err, gw.reported())
	}
	if !slices.ContainsFunc(listed, func(g *schemas.Grant) bool { return g.GrantID == alices.GrantID }) || len(listed) != 2 {
		t.Fatalf("the gateway lists %d grants, want alice's and carol's", len(listed))
	}

	// The gateway cannot write a grant: the server refuses the put.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	forged := *carols
	forged.ExpiresAt = forged.ExpiresAt.Add(1000 * time.Hour)
	data, _ := schemas.Encode(&forged)
	_, err = gwStore.Grants.KV.Put(wctx, carols.GrantID, data)
	cancel()
	if err == nil {
		t.Fatal("the gateway user wrote a grant")
	}
	if g, _, err := adminStore.Grants.Get(ctx, carols.GrantID); err != nil || !g.ExpiresAt.Equal(carols.ExpiresAt) {
		t.Fatalf("carol's grant after the gateway's put: %+v %v", g, err)
	}

	request := func(grant, sender string) *schemas.Decision {
		t.Helper()
		d := &schemas.Decision{DecisionID: "d-revoke-" + sender + "-" + grant[:8], ApprovalID: grant, Transport: "web",
			Decider: schemas.Sender{ID: sender, Kind: schemas.SenderUser, Verified: true}, Option: schemas.OptionRevoke,
			Note: "no longer", SentAt: time.Now().UTC()}
		if err := bus.Publish(ctx, gw.js, topology.DecisionSubject("web", grant), topology.DecisionMsgID(d.DecisionID), d); err != nil {
			t.Fatalf("revocation request as gateway: %v (server said %v)", err, gw.reported())
		}
		return d
	}
	// alice may not revoke carol's grant: refused with its code, nothing changes.
	d := request(carols.GrantID, "alice")
	var rej *schemas.DecisionRejected
	jstest.Eventually(t, pipelinetest.Wait, "the refusal of alice's request", func() bool {
		for _, m := range readAll(t, admin, topology.StreamEvents, topology.EventSubject(topology.SubjectDecisionRejected, carols.GrantID)) {
			if r, err := schemas.Decode[schemas.DecisionRejected](m); err == nil && r.DecisionID == d.DecisionID {
				rej = r
				return true
			}
		}
		return false
	})
	if rej.Code != schemas.CodeDeciderNotAuthorized {
		t.Fatalf("refusal %+v, want %s", rej, schemas.CodeDeciderNotAuthorized)
	}
	if g, _, _ := adminStore.Grants.Get(ctx, carols.GrantID); g.Revoked != nil {
		t.Fatalf("carol's grant revoked by %+v", g.Revoked)
	}
	// alice revokes her own: the approver marks it and announces it.
	request(alices.GrantID, "alice")
	jstest.Eventually(t, pipelinetest.Wait, "alice's grant revoked", func() bool {
		g, _, err := adminStore.Grants.Get(ctx, alices.GrantID)
		return err == nil && g.Revoked != nil && g.Revoked.By == "web:alice" && g.Revoked.Reason == "no longer"
	})
	// The approver announces the revocation after its compare-and-set, so
	// the event can follow the record by a moment: wait for it, then
	// check it is the only one (the revoked event is deduplicated by its
	// message id).
	var n int
	jstest.Eventually(t, pipelinetest.Wait, "the revoked event of alice's grant", func() bool {
		n = len(readAll(t, admin, topology.StreamEvents, topology.GrantEventSubject(schemas.GrantRevoked, alices.GrantID)))
		return n > 0
	})
	if n != 1 {
		t.Fatalf("%d revoked events for alice's grant, want 1", n)
	}
	if m := readAll(t, admin, topology.StreamEvents, topology.GrantEventSubject(schemas.GrantRevoked, carols.GrantID)); len(m) != 0 {
		t.Fatalf("%d revoked events for carol's grant, want none", len(m))
	}
}

// storeOf binds a store to the buckets through js.
func storeOf(t *testing.T, js jetstream.JetStream) *store.Store {
	t.Helper()
	b, err := topology.OpenBuckets(jstest.Ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	return store.New(b)
}

// readAll returns the data of every message of stream on subject, read as
// c (an ordered consumer).
func readAll(t *testing.T, c *client, stream, subject string) [][]byte {
	t.Helper()
	ctx := jstest.Ctx(t)
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Data)
		seq = m.Sequence + 1
	}
}
