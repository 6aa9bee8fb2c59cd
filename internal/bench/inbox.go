package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// inboxLoads is how many first-page loads the inbox phase times per order.
const inboxLoads = 60

// inboxPolicy: web:alice decides every call (each requester their own too).
const inboxPolicy = `{"version": "bench-inbox-1", "default_approval": "required", "approvers": ["web:alice"], "tools": {"write_file": {"approval": "required", "expires_after": "24h"}}}`

// Inbox is the inbox phase's measurement: the web inbox's first page
// (transport/web, served in this process) for a person who may decide
// every one of Pending pending approvals, by order.
type Inbox struct {
	Pending  int         `json:"pending"`
	SeedSec  float64     `json:"seed_seconds"`
	IndexSec float64     `json:"index_seconds"` // the gateway's pending index built from the bucket
	Pages    []InboxPage `json:"pages"`
}

// InboxPage is one first page's figures: the time to its last byte over
// a keep-alive loopback connection (ms) and its HTML size.
type InboxPage struct {
	Query string  `json:"query"`
	N     int     `json:"n"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	Max   float64 `json:"max_ms"`
	Bytes int     `json:"bytes"`
	Rows  int     `json:"rows"`
}

// inbox is the inbox phase: Config.Pending (BENCH_PENDING, 10,000) pending approvals written into
// the approvals bucket as the executor writes them (sealed TurnContexts,
// 100 requesters, 20 tools, 10 channels), then the inbox (web.New, dev
// sign-in) started on them, signed in as web:alice, and its first page
// loaded inboxLoads times in each order.
func (b *bencher) inbox(ctx context.Context, r *Report) {
	res, err := b.inboxRun(ctx)
	if err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("inbox: %v", err))
		return
	}
	r.Inbox = res
	for _, pg := range res.Pages {
		b.cfg.Logf("bench: inbox %s: p50 %.1f ms p95 %.1f ms, %d bytes, %d rows", pg.Query, pg.P50, pg.P95, pg.Bytes, pg.Rows)
	}
}

func (b *bencher) inboxRun(ctx context.Context) (*Inbox, error) {
	e, err := b.startEnv(single)
	if err != nil {
		return nil, err
	}
	defer e.close()
	nc, js, err := e.connect("bench-inbox")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	pol, err := policy.Parse([]byte(inboxPolicy))
	if err != nil {
		return nil, err
	}
	buckets, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		return nil, err
	}
	st := store.New(buckets)
	res := &Inbox{Pending: b.cfg.Pending}

	t0 := time.Now()
	if err := seedPending(ctx, st, b, pol, b.cfg.Pending, "cli"); err != nil {
		return nil, err
	}
	res.SeedSec = time.Since(t0).Seconds()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t0 = time.Now()
	inbox, err := web.New(web.Config{JS: js, Policy: pol, Keys: b.keys, Logger: slog.New(slog.DiscardHandler), Addr: ln.Addr().String(), DevSignIn: true})
	if err != nil {
		ln.Close()
		return nil, err
	}
	defer inbox.Close()
	srv := &http.Server{Handler: inbox, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	client, err := devSignIn(base, "alice")
	if err != nil {
		return nil, err
	}
	if _, _, err := get(client, base+"/"); err != nil { // the first page waits for the index
		return nil, err
	}
	res.IndexSec = time.Since(t0).Seconds()

	rows := regexp.MustCompile(`<li class="row`)
	for _, q := range []string{"/?sort=newest", "/?sort=expiry", "/?sort=newest&tool=tool-7"} {
		var ds []time.Duration
		pg := InboxPage{Query: q}
		for range inboxLoads {
			t := time.Now()
			body, status, err := get(client, base+q)
			if err != nil || status != http.StatusOK {
				return nil, fmt.Errorf("GET %s: %d %v", q, status, err)
			}
			ds = append(ds, time.Since(t))
			pg.Bytes, pg.Rows = len(body), len(rows.FindAllIndex(body, -1))
		}
		slices.Sort(ds)
		ms := func(q float64) float64 {
			return float64(ds[min(int(q*float64(len(ds))+0.999999)-1, len(ds)-1)]) / float64(time.Millisecond)
		}
		pg.N, pg.P50, pg.P95, pg.Max = len(ds), ms(0.50), ms(0.95), ms(1)
		res.Pages = append(res.Pages, pg)
	}
	return res, nil
}

// seedPending writes n pending approvals of transport as the executor
// does (one Create each, a sealed TurnContext), 32 at a time.
func seedPending(ctx context.Context, st *store.Store, b *bencher, pol *policy.Policy, n int, transport string) error {
	now := time.Now().UTC()
	work := make(chan int)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				turn := fmt.Sprintf("t-inbox-%06d", i)
				sender := fmt.Sprintf("user%02d", i%100)
				tool := fmt.Sprintf("tool-%d", i%20)
				args, digest, err := schemas.CanonicalArgs(fmt.Sprintf(`{"path":"notes/%s/%d.txt","content":"line one of the file\nline two of the file, a little longer than the first"}`, sender, i))
				if err != nil {
					errs <- err
					return
				}
				tc := &schemas.TurnContext{
					V: schemas.TurnContextVersion, SessionID: "s-" + sender, SessionKey: schemas.SessionKey(transport, "s-"+sender), TurnID: turn,
					Requester: schemas.Requester{Principal: schemas.Principal(transport, sender), SenderID: sender, Kind: schemas.SenderUser, Verified: true},
					Transport: transport, Channel: schemas.Channel{ID: fmt.Sprintf("room-%d", i%10), Kind: schemas.ChannelPrivate},
					Audience: schemas.AudienceTeam, TrustBoundary: "local", Interactive: true, CreatedAt: now,
				}
				if err := b.keys.Seal(tc); err != nil {
					errs <- err
					return
				}
				at := now.Add(-time.Duration(n-i) * time.Second)
				rec := &schemas.ApprovalRecord{
					V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: tc.SessionID, CallID: "c-0",
					Context: tc, Tool: tool, Args: args, ArgsDigest: digest,
					PolicyVersion: pol.Version(), Options: pol.Options(tool), Quorum: 1,
					Status: schemas.ApprovalPending, RequestedAt: at, ExpiresAt: at.Add(24*time.Hour + time.Duration(i%97)*time.Minute),
				}
				if _, err := st.Approvals.Create(ctx, rec.ApprovalID, rec); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err = <-errs:
	default:
	}
	return err
}

// devSignIn signs in to the inbox at base with its dev form and returns a
// client holding the session's cookie.
func devSignIn(base, subject string) (*http.Client, error) {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 60 * time.Second}
	page, _, err := get(c, base+"/signin")
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
	if m == nil {
		return nil, fmt.Errorf("the sign-in page has no CSRF token")
	}
	resp, err := c.PostForm(base+"/signin/dev", url.Values{"csrf": {string(m[1])}, "subject": {subject}})
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("dev sign-in: %s", resp.Status)
	}
	return c, nil
}

// get reads url whole.
func get(c *http.Client, u string) ([]byte, int, error) {
	resp, err := c.Get(u)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return body, resp.StatusCode, err
}
