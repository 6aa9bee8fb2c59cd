package gateway

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	// pageReadBatch is how many records of a page one read asks for (in
	// one batched direct get, or one get each); the page's byte budget is
	// checked between reads.
	pageReadBatch = 50
	// batchReadWait bounds a batched read's wait for its replies (none
	// come when the request is refused by a permission).
	batchReadWait = 2 * time.Second
	// batchReadsOff is how long pages are read one by one after a batched
	// read failed.
	batchReadsOff = time.Minute
	// pageReaders is how many gets run at once where records are read one
	// by one.
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
	if c := cmp.Compare(e.at, o.at); c != 0 {
		return c
	}
	return strings.Compare(e.id, o.id)
}

// indexLess is the approvals index's order: by transport, then status,
// then as lists are (compare). A page of one transport and status is
// then one seek and a walk of the entries it answers, whatever else the
// index holds.
func indexLess(a, b *approvalEntry) bool {
	if a.transport != b.transport {
		return a.transport < b.transport
	}
	if a.status != b.status {
		return a.status < b.status
	}
	return a.compare(b) < 0
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
	}, log, store.OrderedBy(indexLess))
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

// listStatuses are the statuses ?status=all lists.
var listStatuses = []schemas.ApprovalStatus{schemas.ApprovalPending, schemas.ApprovalApproved,
	schemas.ApprovalDenied, schemas.ApprovalExpired, schemas.ApprovalAbandoned}

// page picks from the index the entries of q's page for transport, in
// order: at most q.limit, and whether more follow. Each status asked for
// is one seek in the index (ordered by transport, status, then as lists
// are) to the position after the cursor and a walk of at most q.limit+1
// matching entries; ?status=all merges the statuses' walks. Only a
// ?session= filter walks past entries it does not list (those of the
// transport and status that belong to other sessions).
func (s *Server) page(q listQuery, transport string) (page []*approvalEntry, more bool) {
	statuses := []schemas.ApprovalStatus{schemas.ApprovalStatus(q.status)}
	if q.status == "all" {
		statuses = listStatuses
	}
	k := q.limit + 1
	var top []*approvalEntry
	for _, st := range statuses {
		from := &approvalEntry{transport: transport, status: st, at: math.MinInt64}
		if q.after != nil {
			from.at, from.id = q.after.at, q.after.id
		}
		n := 0
		s.approvalIdx.Ascend(from, func(e *approvalEntry) bool {
			if e.transport != transport || e.status != st {
				return false
			}
			if q.matches(e, transport) {
				top = append(top, e)
				n++
			}
			return n < k
		})
	}
	if len(statuses) > 1 {
		slices.SortFunc(top, (*approvalEntry).compare)
		top = top[:min(len(top), k)]
	}
	if len(top) > q.limit {
		return top[:q.limit], true
	}
	return top, false
}

// listApprovals answers one page of the key's transport's approvals
// (readListQuery), oldest request first: the entries are chosen from the
// approvals index (filters applied there), then only the page's records
// are read, pageReadBatch at a time (readApprovals), and at most about maxPageBytes of
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
	for from := 0; from < len(entries) && budget > 0; from += pageReadBatch {
		batch := entries[from:min(from+pageReadBatch, len(entries))]
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

// readApprovals reads the records of entries, in their order, with
// their stored sizes; a record gone since (nil) or undecodable is nil
// with size 0. Where the approvals bucket allows direct gets (one
// replica: docs/operations.md), the records are read in one batched
// direct get (multi_last: one request, one reply per record); otherwise,
// or when that request fails (a server or a permission without it), one
// get per record, pageReaders at a time.
func (s *Server) readApprovals(ctx context.Context, entries []*approvalEntry) ([]*schemas.ApprovalRecord, []int, error) {
	if s.batchReads && time.Now().UnixNano() >= s.batchReadsOffUntil.Load() {
		bctx, cancel := context.WithTimeout(ctx, batchReadWait)
		recs, sizes, err := s.readApprovalsBatch(bctx, entries)
		cancel()
		if err == nil {
			s.listReads.WithLabelValues("batched").Inc()
			return recs, sizes, nil
		}
		if ctx.Err() != nil {
			return nil, nil, unavailable(err)
		}
		// A refused or unanswered batch (a permission without it, a server
		// without batched gets) will be so again: read one by one for a
		// while rather than wait on every page.
		s.listReads.WithLabelValues("batch_failed").Inc()
		s.batchReadsOffUntil.Store(time.Now().Add(batchReadsOff).UnixNano())
		s.cfg.Logger.Warn("gateway: a batched read of a list page's approvals failed; reading them one by one for a while",
			"err", err, "for", batchReadsOff)
	}
	s.listReads.WithLabelValues("one_by_one").Inc()
	recs, sizes := make([]*schemas.ApprovalRecord, len(entries)), make([]int, len(entries))
	errs := make([]error, len(entries))
	sem := make(chan struct{}, pageReaders)
	var wg sync.WaitGroup
	for i, e := range entries {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
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

// readApprovalsBatch is readApprovals in one batched direct get of the
// entries' keys' last messages. A key with no message, or whose last
// message is a delete or purge marker, is gone (nil).
func (s *Server) readApprovalsBatch(ctx context.Context, entries []*approvalEntry) ([]*schemas.ApprovalRecord, []int, error) {
	bucket := s.store.Approvals.KV.Bucket()
	prefix := "$KV." + bucket + "."
	at := make(map[string]int, len(entries))
	subjects := make([]string, len(entries))
	for i, e := range entries {
		subjects[i], at[e.id] = prefix+e.id, i
	}
	msgs, err := directGetLast(ctx, s.batchJS, "KV_"+bucket, subjects)
	if err != nil {
		return nil, nil, err
	}
	recs, sizes := make([]*schemas.ApprovalRecord, len(entries)), make([]int, len(entries))
	for _, m := range msgs {
		i, ok := at[strings.TrimPrefix(m.Header.Get(jetstream.SubjectHeader), prefix)]
		if !ok || m.Header.Get(kvOperation) != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
			continue // not asked for (never); deleted, purged or removed by its TTL (as jetstream's KV reads them)
		}
		if a, err := s.store.Approvals.DecodeValue(m.Data); err == nil {
			recs[i], sizes[i] = a, len(m.Data)
		}
	}
	return recs, sizes, nil
}

// directGetLast asks stream, in one batched direct get (NATS ADR-31,
// multi_last; nats-server 2.11 and later), for the last message of each
// of subjects, and returns the messages it answers: one per subject that
// has one, then an end-of-batch status that ends the wait. A reply
// without Nats-Num-Pending (a server without batched gets) or another
// status is an error. It does the job of orbit.go's
// jetstreamext.GetLastMsgsFor, whose reply subscription allocates a
// channel of the connection's full sync-queue length (64K slots) per
// request: measured, that allocation and its garbage were an eighth of a
// list page's cost, so the replies go to a channel of the batch's size.
func directGetLast(ctx context.Context, js jetstream.JetStream, stream string, subjects []string) ([]*nats.Msg, error) {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{subjects, len(subjects)})
	if err != nil {
		return nil, err
	}
	nc := js.Conn()
	inbox := nc.NewRespInbox()
	replies := make(chan *nats.Msg, len(subjects)+1) // every reply fits: none is dropped
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(apiSubject(js, "DIRECT.GET."+stream), inbox, req); err != nil {
		return nil, err
	}
	out := make([]*nats.Msg, 0, len(subjects))
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case m := <-replies:
			switch status := m.Header.Get("Status"); {
			case len(m.Data) == 0 && status == "204": // end of the batch
				return out, nil
			case len(m.Data) == 0 && status == "404": // none of the subjects has a message
				return out, nil
			case status == "503":
				return nil, nats.ErrNoResponders
			case status != "":
				return nil, fmt.Errorf("batched direct get of %s: status %s %s", stream, status, m.Header.Get("Description"))
			case m.Header.Get("Nats-Num-Pending") == "":
				return nil, fmt.Errorf("batched direct get of %s: the server answers no batch", stream)
			}
			out = append(out, m)
		}
	}
}

// apiSubject is the JetStream API subject of js for subject (after its
// API prefix or domain, as the jetstream package forms it).
func apiSubject(js jetstream.JetStream, subject string) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "." + subject
	case o.Domain != "":
		return "$JS." + o.Domain + ".API." + subject
	}
	return "$JS.API." + subject
}
