package web

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

const (
	// PageRows is how many approvals one page of the inbox lists.
	PageRows = 50
	// summaryRunes is how long a row's argument summary is at most.
	summaryRunes = 80
	// maxChoices caps the values a filter's list offers.
	maxChoices = 50
	// sortCookie remembers the person's order between visits.
	sortCookie = "tollgate_inbox_sort"
)

// Orders of the list.
const (
	SortNewest = "newest" // the latest request first (the default)
	SortExpiry = "expiry" // the soonest to expire first; no expiry last
)

// listQuery is what the inbox's query string asks for: filters (exact
// values; empty is any), an order and a page (1-based).
type listQuery struct {
	Tool, Requester, Channel, Transport string
	Sort                                string
	Page                                int
}

// Filtered reports whether a filter is set.
func (q listQuery) Filtered() bool {
	return q.Tool != "" || q.Requester != "" || q.Channel != "" || q.Transport != ""
}

// values is q as a query string's values, page pg (the first page: none).
func (q listQuery) values(pg int) url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"tool": q.Tool, "requester": q.Requester, "channel": q.Channel, "transport": q.Transport} {
		if s != "" {
			v.Set(k, s)
		}
	}
	v.Set("sort", q.Sort)
	if pg > 1 {
		v.Set("page", strconv.Itoa(pg))
	}
	return v
}

// URL is the inbox's address for page pg of q.
func (q listQuery) URL(pg int) string { return "/?" + q.values(pg).Encode() }

// readQuery reads the list's query from r. The order is the query's sort,
// else the one the person last chose (a cookie), else newest first; a
// sort given is remembered.
func readQuery(w http.ResponseWriter, r *http.Request, secure bool) listQuery {
	v := r.URL.Query()
	q := listQuery{Tool: v.Get("tool"), Requester: v.Get("requester"), Channel: v.Get("channel"), Transport: v.Get("transport"), Sort: v.Get("sort")}
	q.Page, _ = strconv.Atoi(v.Get("page"))
	q.Page = max(q.Page, 1)
	switch q.Sort {
	case SortNewest, SortExpiry:
		http.SetCookie(w, &http.Cookie{Name: sortCookie, Value: q.Sort, Path: "/", MaxAge: 365 * 24 * 3600,
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure || r.TLS != nil})
	default:
		q.Sort = SortNewest
		if c, err := r.Cookie(sortCookie); err == nil && c.Value == SortExpiry {
			q.Sort = SortExpiry
		}
	}
	return q
}

// row is one approval in the compact list; Card, when set, is its full
// card (a live prompt carries it, already there to open).
type row struct {
	ID, Tool, Requester, Transport, Channel string
	Summary                                 string
	Warning                                 bool
	RequestedAt, ExpiresAt                  time.Time
	Status                                  schemas.ApprovalStatus
	Card                                    *card
}

// rowOf is rec's row in the list.
func rowOf(rec *schemas.ApprovalRecord) *row {
	rw := &row{ID: rec.ApprovalID, Tool: rec.Tool, RequestedAt: rec.RequestedAt, ExpiresAt: rec.ExpiresAt, Status: rec.Status}
	var f1, f2, f3 bool
	if tc := rec.Context; tc != nil {
		rw.Requester, f1 = reveal.String(tc.Requester.Principal)
		rw.Transport = tc.Transport
		rw.Channel, f2 = reveal.String(tc.Channel.ID)
	}
	rw.Summary, f3 = argSummary(rec.Args)
	rw.Warning = f1 || f2 || f3
	return rw
}

// argSummary is the start of a call's arguments as one line of compact
// JSON, at most summaryRunes long, shown through reveal.
func argSummary(args string) (string, bool) {
	var buf bytes.Buffer
	s := args
	if json.Compact(&buf, []byte(args)) == nil {
		s = buf.String()
	}
	if r := []rune(s); len(r) > summaryRunes {
		s = string(r[:summaryRunes-1]) + "…"
	}
	return reveal.String(s)
}

// listing is one page of the list for one person.
type listing struct {
	Query listQuery
	Rows  []*row
	// Total is how many pending approvals the person may decide match the
	// filters; Pages how many pages they fill.
	Total, Pages int
	// Tools and Transports are the values the filters' lists offer: those
	// of the person's pending approvals (at most maxChoices each).
	Tools, Transports []string
}

// Prev and Next are the pages before and after (0: none).
func (l *listing) Prev() int { return l.Query.Page - 1 }
func (l *listing) Next() int {
	if l.Query.Page < l.Pages {
		return l.Query.Page + 1
	}
	return 0
}

// list is page q.Page of the pending approvals the person of sess may
// decide, filtered and ordered as q says, from the pending index's
// entries: every candidate is judged by the approver's decider rule
// (mayDecide; its verdict on a record's revision is kept per person), and
// each row of the page is judged again as it is shown, so the list never
// shows what the person may not decide. An approval past its expiry is not
// listed (it can no longer be decided).
func (s *Server) list(entries []*pendingEntry, sess *session, q listQuery) *listing {
	now := s.cfg.Now()
	l := &listing{Query: q}
	var mine []*schemas.ApprovalRecord
	tools, transports := map[string]bool{}, map[string]bool{}
	key := sess.deciderKey()
	decide := func(rec *schemas.ApprovalRecord) error { return s.mayDecide(rec, sess) }
	for _, e := range entries {
		rec := e.rec
		if !rec.ExpiresAt.IsZero() && !rec.ExpiresAt.After(now) || rec.Context == nil || e.mayDecide(key, decide) != nil {
			continue
		}
		tools[rec.Tool], transports[rec.Context.Transport] = true, true
		if q.Tool != "" && rec.Tool != q.Tool || q.Transport != "" && rec.Context.Transport != q.Transport ||
			q.Requester != "" && rec.Context.Requester.Principal != q.Requester || q.Channel != "" && rec.Context.Channel.ID != q.Channel {
			continue
		}
		mine = append(mine, rec)
	}
	l.Tools, l.Transports = choices(tools), choices(transports)
	slices.SortFunc(mine, order(q.Sort))
	l.Total = len(mine)
	l.Pages = max((l.Total+PageRows-1)/PageRows, 1)
	from := min((q.Page-1)*PageRows, l.Total)
	for _, rec := range mine[from:min(from+PageRows, l.Total)] {
		if s.mayDecide(rec, sess) != nil {
			continue
		}
		l.Rows = append(l.Rows, rowOf(rec))
	}
	return l
}

// order compares two approvals in the list's order sort; ties (and the
// rest) by id, so a page's order is stable.
func order(sort string) func(a, b *schemas.ApprovalRecord) int {
	return func(a, b *schemas.ApprovalRecord) int {
		var c int
		if sort == SortExpiry {
			c = compareBool(a.ExpiresAt.IsZero(), b.ExpiresAt.IsZero()) // no expiry last
			if c == 0 {
				c = a.ExpiresAt.Compare(b.ExpiresAt)
			}
		} else {
			c = b.RequestedAt.Compare(a.RequestedAt)
		}
		return cmp.Or(c, strings.Compare(a.ApprovalID, b.ApprovalID))
	}
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// choices are set's values, sorted, at most maxChoices.
func choices(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for v := range set {
		if v != "" {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out[:min(len(out), maxChoices)]
}
