package gateway

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Paging of GET /v1/approvals (docs/api.md, "Lists are paged").
const (
	// DefaultPageLimit is a page's length when the request names none.
	DefaultPageLimit = 50
	// MaxPageLimit is the longest page a request may ask for (?limit=).
	MaxPageLimit = 200
	// maxPageBytes bounds the stored bytes of the records one page reads:
	// a page of large records ends early (with a next_cursor), so that a
	// request holds at most about this much, whatever the records' size.
	maxPageBytes = 4 << 20
	// pageReaders is how many records of a page are read at once.
	pageReaders = 8
	// listSyncWait bounds how long a list waits for the approvals index
	// to catch up with the bucket before it answers from what it holds.
	listSyncWait = 2 * time.Second
)

// CodeCursorInvalid: ?cursor= is not a cursor this list gave, or was
// given for other filters.
const CodeCursorInvalid schemas.Code = "CURSOR_INVALID"

// approvalEntry is what the gateway's approvals index holds of one
// approval: the fields a list is filtered and ordered by, not the record
// (which a page reads, for its own approvals only).
type approvalEntry struct {
	id, transport, session string
	status                 schemas.ApprovalStatus
	at                     int64 // requested_at, Unix nanoseconds
}

// compare orders entries as lists are: oldest request first, then by id.
func (e *approvalEntry) compare(o *approvalEntry) int {
	return cmp.Or(cmp.Compare(e.at, o.at), strings.Compare(e.id, o.id))
}

// startApprovalIndex follows the approvals bucket: every approval's
// transport, session, status and request time, by id (store.Index). Its
// memory is a small entry per approval the bucket holds, whatever the
// records' size; a list filters and orders these entries and reads only
// the records of its page.
func startApprovalIndex(ctx context.Context, st *store.Store, log *slog.Logger) (*store.Index[*approvalEntry], error) {
	// Transports and statuses are few: one string each, shared by every
	// entry (the index applies entries from one goroutine).
	interned := map[string]string{}
	intern := func(s string) string {
		if v, ok := interned[s]; ok {
			return v
		}
		interned[s] = s
		return s
	}
	return store.NewIndex(ctx, st.Approvals.KV, "the approvals", func(key string, value []byte) (*approvalEntry, bool) {
		a, err := st.Approvals.DecodeValue(value)
		if err != nil || a.Context == nil {
			// Listed nowhere, as a read of it answers 404.
			log.Warn("gateway: an approval record does not decode", "key", key, "err", err)
			return nil, false
		}
		return &approvalEntry{id: key, transport: intern(a.Context.Transport), session: a.SessionID,
			status: schemas.ApprovalStatus(intern(string(a.Status))), at: a.RequestedAt.UnixNano()}, true
	}, log)
}

// ApprovalList is the body of GET /v1/approvals: one page, and the
// cursor of the next (absent on the last page).
type ApprovalList struct {
	Approvals  []*ApprovalView `json:"approvals"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

// listQuery is a list request: its filters, the position after which the
// page starts (zero: the first page) and its length.
type listQuery struct {
	status, session string // status "all": any
	after           *approvalEntry
	limit           int
}

// filters is the part of a cursor that binds it to its list's filters.
func (q listQuery) filters() string { return hashParts("approvals", q.status, q.session)[:12] }

// matches reports whether e is in q's list for transport.
func (q listQuery) matches(e *approvalEntry, transport string) bool {
	return e.transport == transport && (q.status == "all" || string(e.status) == q.status) &&
		(q.session == "" || e.session == q.session) && (q.after == nil || e.compare(q.after) > 0)
}

// cursor is the opaque cursor of the page that starts after e: the
// position (request time and id) and the filters it was given for.
func (q listQuery) cursor(e *approvalEntry) string {
	return base64.RawURLEncoding.EncodeToString([]byte("1|" + q.filters() + "|" + strconv.FormatInt(e.at, 10) + "|" + e.id))
}

// readListQuery reads ?status= (pending by default; "all" for every
// status), ?session=, ?limit= (1 to MaxPageLimit, default
// DefaultPageLimit) and ?cursor= (a next_cursor of the same filters).
func readListQuery(r *http.Request) (listQuery, error) {
	v := r.URL.Query()
	q := listQuery{status: v.Get("status"), session: v.Get("session"), limit: DefaultPageLimit}
	switch schemas.ApprovalStatus(q.status) {
	case "":
		q.status = string(schemas.ApprovalPending)
	case "all", schemas.ApprovalPending, schemas.ApprovalApproved, schemas.ApprovalDenied, schemas.ApprovalExpired, schemas.ApprovalAbandoned:
	default:
		return q, errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "status: want pending, approved, denied, expired, abandoned or all")
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxPageLimit {
			return q, errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "limit: want a whole number from 1 to %d", MaxPageLimit)
		}
		q.limit = n
	}
	if c := v.Get("cursor"); c != "" {
		after, err := q.parseCursor(c)
		if err != nil {
			return q, err
		}
		q.after = after
	}
	return q, nil
}

// parseCursor reads a cursor that q.cursor made for q's filters.
func (q listQuery) parseCursor(c string) (*approvalEntry, error) {
	bad := func(why string) error {
		return errorf(http.StatusBadRequest, CodeCursorInvalid, "cursor: %s; start again without one", why)
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(c) > 2*schemas.MaxIDBytes {
		return nil, bad("not a cursor of this list")
	}
	parts := strings.SplitN(string(raw), "|", 4)
	if len(parts) != 4 || parts[0] != "1" {
		return nil, bad("not a cursor of this list")
	}
	at, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || !schemas.ValidKey(parts[3]) {
		return nil, bad("not a cursor of this list")
	}
	if parts[1] != q.filters() {
		return nil, bad("given for other filters (status, session)")
	}
	return &approvalEntry{at: at, id: parts[3]}, nil
}

// page picks from the index the entries of q's page for transport, in
// order: at most q.limit, and whether more follow. It keeps q.limit+1
// entries at most while it scans, whatever the index holds.
func (s *Server) page(q listQuery, transport string) (page []*approvalEntry, more bool) {
	k := q.limit + 1
	top := make([]*approvalEntry, 0, k)
	s.approvalIdx.Each(func(_ string, e *approvalEntry) {
		if !q.matches(e, transport) {
			return
		}
		if len(top) == k && e.compare(top[k-1]) >= 0 {
			return
		}
		i, _ := slices.BinarySearchFunc(top, e, (*approvalEntry).compare)
		if len(top) == k {
			top = top[:k-1]
		}
		top = slices.Insert(top, i, e)
	})
	if len(top) > q.limit {
		return top[:q.limit], true
	}
	return top, false
}

// listApprovals answers one page of the key's transport's approvals
// (readListQuery), oldest request first: the entries are chosen from the
// approvals index (filters applied there), then only the page's records
// are read, pageReaders at a time, and at most about maxPageBytes of
// them. A record that changed since the index saw it (decided meanwhile)
// is left out when it no longer matches: a page may be shorter than
// limit while more follow, and only the absence of next_cursor ends the
// list.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request, key *Key) error {
	q, err := readListQuery(r)
	if err != nil {
		return err
	}
	if err := s.approvalIdx.Sync(r.Context(), listSyncWait); err != nil {
		if !errors.Is(err, store.ErrIndexBehind) {
			return unavailable(err)
		}
		s.cfg.Logger.Warn("gateway: approvals listed from an index that is behind", "err", err)
	}
	entries, more := s.page(q, key.Transport)
	out := ApprovalList{Approvals: make([]*ApprovalView, 0, len(entries))}
	budget, last := maxPageBytes, -1
	for from := 0; from < len(entries) && budget > 0; from += pageReaders {
		batch := entries[from:min(from+pageReaders, len(entries))]
		recs, sizes, err := s.readApprovals(r.Context(), batch)
		if err != nil {
			return err
		}
		for i, a := range recs {
			if budget <= 0 {
				break
			}
			budget -= sizes[i]
			last = from + i
			if a != nil && a.Context != nil && a.Context.Transport == key.Transport &&
				(q.status == "all" || string(a.Status) == q.status) && (q.session == "" || a.SessionID == q.session) {
				out.Approvals = append(out.Approvals, approvalView(a).disclosedTo(key))
			}
		}
	}
	if last >= 0 && (more || last < len(entries)-1) {
		out.NextCursor = q.cursor(entries[last])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// readApprovals reads the records of entries at once, in their order,
// with their stored sizes; a record gone since (nil) or undecodable is
// nil with size 0.
func (s *Server) readApprovals(ctx context.Context, entries []*approvalEntry) ([]*schemas.ApprovalRecord, []int, error) {
	recs, sizes := make([]*schemas.ApprovalRecord, len(entries)), make([]int, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i, e := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv, err := s.store.Approvals.KV.Get(ctx, e.id)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
				return
			case err != nil:
				errs[i] = err
				return
			}
			if a, err := s.store.Approvals.DecodeValue(kv.Value()); err == nil {
				recs[i], sizes[i] = a, len(kv.Value())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, unavailable(err)
	}
	return recs, sizes, nil
}
