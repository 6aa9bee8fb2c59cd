package web_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// seedPending writes n pending count approvals into the approvals bucket
// as the executor writes them (a sealed TurnContext, one Create each):
// team turns of cli:u0..u2 in room-0/room-1, the i-th requested i minutes
// after base and expiring (97*i mod n) minutes after an hour from now, so
// the two orders differ. web:alice may decide every one (testPolicy).
func (in *inbox) seedPending(n int, base time.Time) []*schemas.ApprovalRecord {
	in.t.Helper()
	out := make([]*schemas.ApprovalRecord, n)
	for i := range n {
		turn, sender := in.NextID("t-seed"), fmt.Sprintf("u%d", i%3)
		args, digest, err := schemas.CanonicalArgs(fmt.Sprintf(`{"path":"notes/%s/%d.txt","n":%d}`, sender, i, i))
		if err != nil {
			in.t.Fatal(err)
		}
		tc := &schemas.TurnContext{
			V: schemas.TurnContextVersion, SessionID: "s-" + sender, SessionKey: schemas.SessionKey("cli", "s-"+sender), TurnID: turn,
			Requester: schemas.Requester{Principal: "cli:" + sender, SenderID: sender, Kind: schemas.SenderUser, Verified: true},
			Transport: "cli", Channel: schemas.Channel{ID: fmt.Sprintf("room-%d", i%2), Kind: schemas.ChannelPrivate},
			Audience: schemas.AudienceTeam, TrustBoundary: "local", Interactive: true, CreatedAt: base,
		}
		if err := in.Keys.Seal(tc); err != nil {
			in.t.Fatal(err)
		}
		at := base.Add(time.Duration(i) * time.Minute)
		out[i] = &schemas.ApprovalRecord{
			V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: tc.SessionID, CallID: "c-0",
			Context: tc, Tool: "count", Args: args, ArgsDigest: digest, PolicyVersion: in.Policy.Version(), Options: in.Policy.Options("count"),
			Quorum: 1, Status: schemas.ApprovalPending, RequestedAt: at, ExpiresAt: time.Now().UTC().Add(time.Hour + time.Duration(97*i%n)*time.Minute),
		}
		if _, err := in.Store.Approvals.Create(context.Background(), out[i].ApprovalID, out[i]); err != nil {
			in.t.Fatal(err)
		}
	}
	return out
}

var rowID = regexp.MustCompile(`<li class="row[^"]*" id="row-([^"]+)"`)

// rowIDs are the approval ids of a page's rows, in order.
func rowIDs(page string) []string {
	var ids []string
	for _, m := range rowID.FindAllStringSubmatch(page, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// TestInboxListFromItsIndex: the inbox lists the pending approvals from
// the process's pending index, never reading the approvals bucket on a
// page load (no consumer made on it, no record read); one page holds
// web.PageRows rows, newest first or soonest to expire first (the choice
// remembered), filtered by requester, channel, transport and tool, with
// the count in the title; a person who may decide none sees none; an
// approval past its expiry is not listed; a decided one leaves the list.
func TestInboxListFromItsIndex(t *testing.T) {
	in := startInbox(t, nil)
	const n = 120
	recs := in.seedPending(n, time.Now().UTC().Add(-3*time.Hour))
	alice, mallory := in.browser(), in.browser()
	alice.signIn("alice")
	mallory.signIn("mallory")

	// The inbox's reads of the approvals bucket: consumers made on its
	// stream (a key listing or a watch) and record reads.
	var reads atomic.Int64
	for _, subj := range []string{"$JS.API.CONSUMER.CREATE.KV_" + topology.BucketApprovals + ".>", "$JS.API.DIRECT.GET.KV_" + topology.BucketApprovals + ".>", "$JS.API.STREAM.MSG.GET.KV_" + topology.BucketApprovals} {
		sub, err := in.Env.NC.Subscribe(subj, func(*nats.Msg) { reads.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := in.Env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	var page string
	jstest.Eventually(t, 10*time.Second, "the first page lists every seeded approval", func() bool {
		_, page = alice.do("GET", "/?sort=newest", nil)
		return strings.Contains(page, fmt.Sprintf(`<span id="total">%d</span>`, n))
	})
	for range 3 {
		_, page = alice.do("GET", "/?sort=newest", nil)
	}
	if err := in.Env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := reads.Load(); got != 0 {
		t.Errorf("the page loads read the approvals bucket %d times", got)
	}

	newest := func(i int) string { return recs[n-1-i].ApprovalID }
	ids := rowIDs(page)
	if len(ids) != web.PageRows || ids[0] != newest(0) || ids[web.PageRows-1] != newest(web.PageRows-1) {
		t.Fatalf("first page: %d rows, from %v", len(ids), ids[:min(len(ids), 3)])
	}
	if !strings.Contains(page, fmt.Sprintf("<title>(%d) Approvals · Tollgate</title>", n)) {
		t.Errorf("the title does not count the approvals waiting")
	}
	if strings.Contains(page, recs[0].ArgsDigest) || !strings.Contains(page, `href="/approvals/`+newest(0)+`"`) {
		t.Errorf("a row is not compact: it holds the card, or no link to it")
	}
	if _, last := alice.do("GET", "/?sort=newest&page=3", nil); len(rowIDs(last)) != n-2*web.PageRows || rowIDs(last)[0] != newest(2*web.PageRows) {
		t.Errorf("the third page: %v", rowIDs(last))
	}

	_, byExpiry := alice.do("GET", "/?sort=expiry", nil)
	ids = rowIDs(byExpiry)
	for i := 1; i < len(ids); i++ {
		if in.Approval(ids[i-1]).ExpiresAt.After(in.Approval(ids[i]).ExpiresAt) {
			t.Fatalf("soonest to expire first: row %d expires before row %d", i, i-1)
		}
	}
	if _, again := alice.do("GET", "/", nil); strings.Join(rowIDs(again), ",") != strings.Join(ids, ",") {
		t.Errorf("the order chosen is not remembered")
	}
	if _, other := mallory.do("GET", "/", nil); len(rowIDs(other)) != 0 {
		t.Errorf("web:mallory, who may decide none, is listed %d", len(rowIDs(other)))
	}

	for _, f := range []struct {
		query string
		want  func(*schemas.ApprovalRecord) bool
	}{
		{"requester=cli:u1", func(r *schemas.ApprovalRecord) bool { return r.Context.Requester.Principal == "cli:u1" }},
		{"channel=room-1", func(r *schemas.ApprovalRecord) bool { return r.Context.Channel.ID == "room-1" }},
		{"requester=cli:u2&channel=room-0", func(r *schemas.ApprovalRecord) bool {
			return r.Context.Requester.Principal == "cli:u2" && r.Context.Channel.ID == "room-0"
		}},
		{"transport=slack", func(*schemas.ApprovalRecord) bool { return false }},
		{"tool=pair", func(*schemas.ApprovalRecord) bool { return false }},
	} {
		_, got := alice.do("GET", "/?sort=newest&"+f.query, nil)
		var want []string
		for i := n - 1; i >= 0 && len(want) < web.PageRows; i-- {
			if f.want(recs[i]) {
				want = append(want, recs[i].ApprovalID)
			}
		}
		if strings.Join(rowIDs(got), ",") != strings.Join(want, ",") {
			t.Errorf("%s: %d rows, want %d", f.query, len(rowIDs(got)), len(want))
		}
	}

	// A decided approval leaves the list; one past its expiry is not in it.
	if _, _, err := in.Store.Approvals.Mutate(context.Background(), newest(0), func(r *schemas.ApprovalRecord) error {
		r.Status, r.Decision = schemas.ApprovalDenied, &schemas.DecisionInfo{Principal: "cli:u2", Option: "deny", DecidedAt: time.Now().UTC()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	past := in.seedPending(1, time.Now().UTC().Add(-3*time.Hour))[0]
	past, _, _ = in.Store.Approvals.Mutate(context.Background(), past.ApprovalID, func(r *schemas.ApprovalRecord) error {
		r.ExpiresAt = time.Now().Add(-time.Minute)
		return nil
	})
	jstest.Eventually(t, 10*time.Second, "the decided approval leaves the list", func() bool {
		_, page = alice.do("GET", "/?sort=newest", nil)
		return !strings.Contains(page, newest(0)) && strings.Contains(page, fmt.Sprintf(`<span id="total">%d</span>`, n-1))
	})
	if strings.Contains(page, past.ApprovalID) {
		t.Errorf("an approval past its expiry is listed")
	}
	if resp, _ := alice.do("GET", "/approvals/"+newest(0), nil); resp.StatusCode != http.StatusOK {
		t.Errorf("the decided approval's own page: %d", resp.StatusCode)
	}
}
