package gateway

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// walk pages through GET /v1/approvals with query q (without cursor) as
// key, following next_cursor, and returns every approval id in the order
// listed and the pages' lengths. A page longer than want (the limit) or a
// cursor seen twice fails the test.
func (g *gw) walk(key string, q url.Values, limit int) (ids []string, pages []int) {
	g.t.Helper()
	seen := map[string]bool{}
	for cursor := ""; ; {
		v := url.Values{}
		for k, vs := range q {
			v[k] = vs
		}
		if cursor != "" {
			v.Set("cursor", cursor)
		}
		resp, body := g.do("GET", "/v1/approvals?"+v.Encode(), key, nil)
		l := want[ApprovalList](g.t, resp, body, http.StatusOK)
		if len(l.Approvals) > limit {
			g.t.Fatalf("a page of %d approvals, want at most %d", len(l.Approvals), limit)
		}
		for _, a := range l.Approvals {
			ids = append(ids, a.ApprovalID)
		}
		pages = append(pages, len(l.Approvals))
		if l.NextCursor == "" {
			return ids, pages
		}
		if seen[l.NextCursor] || len(pages) > 1000 {
			g.t.Fatalf("the cursor %q came back: the list does not end", l.NextCursor)
		}
		seen[l.NextCursor] = true
		cursor = l.NextCursor
	}
}

// inOrder are the ids of recs in the list's order: oldest request first,
// then by id.
func inOrder(recs []*schemas.ApprovalRecord) []string {
	recs = slices.Clone(recs)
	slices.SortFunc(recs, func(a, b *schemas.ApprovalRecord) int {
		return cmp.Or(a.RequestedAt.Compare(b.RequestedAt), strings.Compare(a.ApprovalID, b.ApprovalID))
	})
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ApprovalID
	}
	return out
}

// TestApprovalListIsPaged: GET /v1/approvals answers pages in a stable
// order (oldest request first, ties by id), cursor by cursor, without a
// duplicate or a gap, filtered by status and session before the page is
// cut, never showing another transport's approvals; limit and cursor are
// checked, with reason codes.
func TestApprovalListIsPaged(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, nil)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var pending, s1, approved []*schemas.ApprovalRecord
	for i := range 130 {
		session := fmt.Sprintf("s-%d", i%2+1)
		// Two approvals share each request time: the id orders them.
		rec := g.H.SeedApproval("gateway", session, "alice", "write_file", fmt.Sprintf(`{"path":"f%d","content":"x"}`, i), base.Add(time.Duration(i/2)*time.Second))
		if i%13 == 0 {
			g.H.MutateApproval(rec.ApprovalID, func(a *schemas.ApprovalRecord) { a.Status = schemas.ApprovalApproved })
			approved = append(approved, rec)
			continue
		}
		pending = append(pending, rec)
		if session == "s-1" {
			s1 = append(s1, rec)
		}
	}
	var other []*schemas.ApprovalRecord
	for i := range 7 {
		other = append(other, g.H.SeedApproval("other", "s-1", "bob", "write_file", fmt.Sprintf(`{"path":"o%d","content":"x"}`, i), base.Add(time.Duration(i)*time.Second)))
	}

	t.Run("pending approvals page by page, none twice, none missing", func(t *testing.T) {
		ids, pages := g.walk("a", url.Values{"limit": {"25"}}, 25)
		if want := inOrder(pending); !slices.Equal(ids, want) {
			t.Fatalf("listed %d approvals %v,\nwant %d in order %v", len(ids), ids, len(want), want)
		}
		if len(pages) != (len(pending)+24)/25 {
			t.Errorf("pages %v: want %d full pages of 25 but the last", pages, (len(pending)+24)/25)
		}
	})
	t.Run("a page is 50 approvals unless limit says otherwise", func(t *testing.T) {
		resp, body := g.do("GET", "/v1/approvals", "a", nil)
		l := want[ApprovalList](t, resp, body, http.StatusOK)
		if len(l.Approvals) != DefaultPageLimit || l.NextCursor == "" {
			t.Fatalf("first page: %d approvals, next cursor %q; want %d and a cursor", len(l.Approvals), l.NextCursor, DefaultPageLimit)
		}
		resp, body = g.do("GET", "/v1/approvals?limit=200", "a", nil)
		if l := want[ApprovalList](t, resp, body, http.StatusOK); len(l.Approvals) != len(pending) || l.NextCursor != "" {
			t.Fatalf("limit=200: %d approvals, next cursor %q; want all %d and none", len(l.Approvals), l.NextCursor, len(pending))
		}
	})
	t.Run("the session filter", func(t *testing.T) {
		ids, _ := g.walk("a", url.Values{"session": {"s-1"}, "limit": {"10"}}, 10)
		if want := inOrder(s1); !slices.Equal(ids, want) {
			t.Fatalf("session s-1: %v, want %v", ids, want)
		}
	})
	t.Run("the status filter", func(t *testing.T) {
		ids, _ := g.walk("a", url.Values{"status": {"approved"}, "limit": {"3"}}, 3)
		if want := inOrder(approved); !slices.Equal(ids, want) {
			t.Fatalf("approved: %v, want %v", ids, want)
		}
		ids, _ = g.walk("a", url.Values{"status": {"all"}, "limit": {"200"}}, 200)
		if want := inOrder(append(slices.Clone(pending), approved...)); !slices.Equal(ids, want) {
			t.Fatalf("all: %d approvals, want %d", len(ids), len(want))
		}
	})
	t.Run("another transport's key lists only its own", func(t *testing.T) {
		ids, _ := g.walk("b", url.Values{"limit": {"2"}}, 2)
		if want := inOrder(other); !slices.Equal(ids, want) {
			t.Fatalf("transport other: %v, want %v", ids, want)
		}
	})
	t.Run("approvals requested or decided between pages", func(t *testing.T) {
		resp, body := g.do("GET", "/v1/approvals?limit=20", "a", nil)
		first := want[ApprovalList](t, resp, body, http.StatusOK)
		// After the first page: one more is requested (it is the newest),
		// and one the first page did not reach is decided.
		late := g.H.SeedApproval("gateway", "s-2", "alice", "write_file", `{"path":"late","content":"x"}`, time.Now())
		order := inOrder(pending)
		gone := order[30]
		g.H.MutateApproval(gone, func(a *schemas.ApprovalRecord) { a.Status = schemas.ApprovalDenied })
		ids := []string{}
		for _, a := range first.Approvals {
			ids = append(ids, a.ApprovalID)
		}
		for cursor := first.NextCursor; cursor != ""; {
			resp, body := g.do("GET", "/v1/approvals?limit=20&cursor="+url.QueryEscape(cursor), "a", nil)
			l := want[ApprovalList](t, resp, body, http.StatusOK)
			for _, a := range l.Approvals {
				ids = append(ids, a.ApprovalID)
			}
			cursor = l.NextCursor
		}
		want := append(slices.DeleteFunc(slices.Clone(order), func(id string) bool { return id == gone }), late.ApprovalID)
		if !slices.Equal(ids, want) {
			t.Fatalf("listed %v,\nwant %v", ids, want)
		}
	})

	resp, body := g.do("GET", "/v1/approvals?limit=5", "a", nil)
	cursor := want[ApprovalList](t, resp, body, http.StatusOK).NextCursor
	forged := base64.RawURLEncoding.EncodeToString([]byte("1|000000000000|0|a-x-0"))
	for _, tc := range []struct {
		name, query string
		code        schemas.Code
	}{
		{"a limit of zero", "limit=0", schemas.CodeInvalidInput},
		{"a limit over the maximum", "limit=201", schemas.CodeInvalidInput},
		{"a limit that is not a number", "limit=ten", schemas.CodeInvalidInput},
		{"a cursor that is not one", "cursor=%21%21%21", CodeCursorInvalid},
		{"a cursor made up from its format", "cursor=" + forged, CodeCursorInvalid},
		{"a truncated cursor", "cursor=" + cursor[:10], CodeCursorInvalid},
		{"a cursor of the pending list used for approved ones", "status=approved&cursor=" + cursor, CodeCursorInvalid},
		{"a cursor of all sessions used for one session", "session=s-1&cursor=" + cursor, CodeCursorInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := g.do("GET", "/v1/approvals?"+tc.query, "a", nil)
			wantProblem(t, resp, body, http.StatusBadRequest, tc.code)
		})
	}
}

// TestPageReadsAgree: a page's records read in one batched direct get
// and read one by one are the same, for live records and for keys that
// are gone (deleted, purged, never written, a put after a delete), in the
// page's order; and the list answers through both.
func TestPageReadsAgree(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, nil)
	if !g.s.batchReads {
		t.Fatal("the test bucket (one replica) allows direct gets: batched reads should be on")
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var recs []*schemas.ApprovalRecord
	for i := range 6 {
		recs = append(recs, g.H.SeedApproval("gateway", "s-1", "alice", "write_file", fmt.Sprintf(`{"path":"r%d","content":"x"}`, i), base.Add(time.Duration(i)*time.Second)))
	}
	ctx := jstest.Ctx(t)
	kv := g.H.Store.Approvals.KV
	if err := kv.Delete(ctx, recs[1].ApprovalID); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, recs[3].ApprovalID); err != nil {
		t.Fatal(err)
	}
	// Deleted, then written again: the later value is the one read.
	if err := kv.Delete(ctx, recs[4].ApprovalID); err != nil {
		t.Fatal(err)
	}
	again := *recs[4]
	again.SessionID = "s-again"
	if _, err := g.H.Store.Approvals.Create(ctx, again.ApprovalID, &again); err != nil {
		t.Fatal(err)
	}
	var entries []*approvalEntry
	for _, id := range []string{recs[5].ApprovalID, recs[1].ApprovalID, "a-never-written-0", recs[0].ApprovalID, recs[3].ApprovalID, recs[4].ApprovalID, recs[2].ApprovalID} {
		entries = append(entries, &approvalEntry{id: id})
	}
	wantIDs := []string{recs[5].ApprovalID, "", "", recs[0].ApprovalID, "", recs[4].ApprovalID, recs[2].ApprovalID}
	read := func(batched bool) []*schemas.ApprovalRecord {
		t.Helper()
		g.s.batchReads = batched
		defer func() { g.s.batchReads = true }()
		before := testutil.ToFloat64(g.s.listReads.WithLabelValues("batched"))
		got, sizes, err := g.s.readApprovals(ctx, entries)
		if err != nil {
			t.Fatalf("batched %v: %v", batched, err)
		}
		if moved := testutil.ToFloat64(g.s.listReads.WithLabelValues("batched")) - before; (moved == 1) != batched {
			t.Fatalf("batched %v: the batched-read count moved by %v", batched, moved)
		}
		for i, a := range got {
			id := ""
			if a != nil {
				id = a.ApprovalID
				if sizes[i] == 0 {
					t.Errorf("batched %v: %s read with size 0", batched, id)
				}
			}
			if id != wantIDs[i] {
				t.Errorf("batched %v: entry %d (%s) read as %q, want %q", batched, i, entries[i].id, id, wantIDs[i])
			}
		}
		return got
	}
	batched, oneByOne := read(true), read(false)
	if batched[5] == nil || batched[5].SessionID != "s-again" || oneByOne[5] == nil || oneByOne[5].SessionID != "s-again" {
		t.Fatal("a key written again after its delete: want its new value from both reads")
	}
	for i := range batched {
		if !reflect.DeepEqual(batched[i], oneByOne[i]) {
			t.Errorf("entry %d: batched %+v, one by one %+v", i, batched[i], oneByOne[i])
		}
	}
	for _, on := range []bool{true, false} {
		g.s.batchReads = on
		ids, _ := g.walk("a", url.Values{"limit": {"2"}}, 2)
		if want := []string{recs[0].ApprovalID, recs[2].ApprovalID, recs[4].ApprovalID, recs[5].ApprovalID}; !slices.Equal(ids, want) {
			t.Errorf("batched reads %v: listed %v, want %v", on, ids, want)
		}
	}
	g.s.batchReads = true
}

// TestAFailedBatchedReadFallsBack: where the batched direct get is not
// answered (here: sent under an API prefix nobody serves, as a server or
// a permission without it would leave it), the page is read one by one
// and answers in full, and the next pages do not try the batch again.
func TestAFailedBatchedReadFallsBack(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, nil)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var want []string
	for i := range 5 {
		want = append(want, g.H.SeedApproval("gateway", "s-1", "alice", "write_file", fmt.Sprintf(`{"path":"r%d","content":"x"}`, i), base.Add(time.Duration(i)*time.Second)).ApprovalID)
	}
	nowhere, err := jetstream.NewWithAPIPrefix(g.H.JS.Conn(), "NOBODY.API")
	if err != nil {
		t.Fatal(err)
	}
	g.s.batchJS = nowhere
	count := func(how string) float64 { return testutil.ToFloat64(g.s.listReads.WithLabelValues(how)) }
	ids, pages := g.walk("a", url.Values{"limit": {"2"}}, 2)
	if !slices.Equal(ids, want) {
		t.Fatalf("listed %v, want %v", ids, want)
	}
	if got := count("batch_failed"); got != 1 {
		t.Errorf("batch_failed %v after %d pages, want 1: one failure turns batched reads off for a while", got, len(pages))
	}
	if got, want := count("one_by_one"), float64(len(pages)); got != want {
		t.Errorf("one_by_one %v, want %v (every page)", got, want)
	}
	if got := count("batched"); got != 0 {
		t.Errorf("batched %v, want 0", got)
	}
}
