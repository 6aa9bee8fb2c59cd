package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

// listClients is how many clients page through the approvals at once in
// the approvals phase, each with a key of its own.
const listClients = 16

// listPace is the least time between one client's requests: a key's
// default rate is 20 requests a second (gateway.Config.Rate).
const listPace = 55 * time.Millisecond

// ApprovalLists is the approvals phase's measurement: GET /v1/approvals
// of a `tollgate gateway` process with Pending approvals pending, paged
// through by listClients clients at once.
type ApprovalLists struct {
	Pending  int     `json:"pending"`
	SeedSec  float64 `json:"seed_seconds"`
	IndexSec float64 `json:"index_seconds"` // gateway start -> the first page answered
	// RSSIdle is the gateway's resident memory after its first page;
	// RSSPeak its peak (VmHWM) over the whole run.
	RSSIdle int64       `json:"rss_idle"`
	RSSPeak int64       `json:"rss_peak"`
	Sweeps  []ListSweep `json:"sweeps"`
}

// ListSweep is every client paging through the whole list with one
// limit: each request's time to the last byte (ms), and the pages' size.
type ListSweep struct {
	Limit    int     `json:"limit"`
	N        int     `json:"n"`
	Listed   int     `json:"listed_per_client"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	AvgBytes int     `json:"avg_bytes"`
}

// approvals is the approvals phase: Config.Pending (BENCH_PENDING,
// 10,000) pending approvals of one transport written into the approvals
// bucket as the executor writes them, then `tollgate gateway` started on
// them with listClients read keys of that transport, and every client
// paging through the whole list at once (each at most one request per
// listPace), with the default page and with the longest.
func (b *bencher) approvals(ctx context.Context, r *Report) {
	res, err := b.approvalsRun(ctx)
	if err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("approvals: %v", err))
		return
	}
	r.Approvals = res
	b.cfg.Logf("bench: approvals list: gateway RSS %.1f MiB idle, %.1f MiB peak", float64(res.RSSIdle)/(1<<20), float64(res.RSSPeak)/(1<<20))
	for _, s := range res.Sweeps {
		b.cfg.Logf("bench: approvals list limit %d: p50 %.1f ms p99 %.1f ms max %.1f ms, n=%d, %d bytes a page", s.Limit, s.P50, s.P99, s.Max, s.N, s.AvgBytes)
	}
}

func (b *bencher) approvalsRun(ctx context.Context) (*ApprovalLists, error) {
	e, err := b.startEnv(single)
	if err != nil {
		return nil, err
	}
	defer e.close()
	nc, js, err := e.connect("bench-approvals")
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
	res := &ApprovalLists{Pending: b.cfg.Pending}
	t0 := time.Now()
	if err := seedPending(ctx, store.New(buckets), b, pol, b.cfg.Pending, gatewayTransport); err != nil {
		return nil, err
	}
	res.SeedSec = time.Since(t0).Seconds()

	// The keys, and the gateway as its own process.
	var tokens []string
	var kf gateway.KeysFile
	for range listClients {
		tok, k := gateway.NewKey(gatewayTransport, []gateway.Scope{gateway.ScopeRead}, false)
		tokens, kf.Keys = append(tokens, tok), append(kf.Keys, k)
	}
	keysFile := filepath.Join(e.dir, "gateway-keys.json")
	data, _ := json.Marshal(kf)
	if err := os.WriteFile(keysFile, data, 0o600); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(e.dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(b.cfg.BinDir, "tollgate"), "gateway", "--keys", keysFile, "--http", addr)
	cmd.Env = append(childproc.Env(), "TOLLGATE_NATS_URL="+e.url, "TOLLGATE_METRICS_ADDR=", "TOLLGATE_LOG_LEVEL="+b.cfg.LogLevel)
	cmd.Dir, cmd.Stdout, cmd.Stderr = e.dir, logf, logf
	t0 = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the gateway: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	base := "http://" + addr + "/v1/approvals"
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: listClients}}
	list := func(token, query string) (*gateway.ApprovalList, int, error) {
		req, _ := http.NewRequest("GET", base+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		var l gateway.ApprovalList
		n, err := readJSON(resp, &l)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET /v1/approvals%s: %s", query, resp.Status)
		}
		return &l, n, err
	}
	if err := waitFor(60*time.Second, "the gateway's first page", func() bool {
		l, _, err := list(tokens[0], "?limit=1")
		return err == nil && len(l.Approvals) == 1
	}); err != nil {
		return nil, fmt.Errorf("%w (log %s)", err, logf.Name())
	}
	res.IndexSec = time.Since(t0).Seconds()
	time.Sleep(time.Second)
	res.RSSIdle, _, _ = rss(cmd.Process.Pid)

	for _, limit := range []int{gateway.DefaultPageLimit, gateway.MaxPageLimit} {
		sw := ListSweep{Limit: limit}
		var mu sync.Mutex
		var ds []time.Duration
		var bytes, pages int
		errs := make(chan error, listClients)
		var wg sync.WaitGroup
		for c := range listClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				listed := 0
				for cursor := ""; ; {
					q := fmt.Sprintf("?limit=%d", limit)
					if cursor != "" {
						q += "&cursor=" + url.QueryEscape(cursor)
					}
					start := time.Now()
					l, n, err := list(tokens[c], q)
					d := time.Since(start)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					ds, bytes, pages = append(ds, d), bytes+n, pages+1
					mu.Unlock()
					listed += len(l.Approvals)
					if cursor = l.NextCursor; cursor == "" {
						break
					}
					time.Sleep(listPace - d)
				}
				if listed != b.cfg.Pending {
					errs <- fmt.Errorf("a client listed %d approvals with limit %d, want %d", listed, limit, b.cfg.Pending)
				}
				mu.Lock()
				sw.Listed = listed
				mu.Unlock()
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			return nil, err
		default:
		}
		p := percentiles(ds)
		sw.N, sw.P50, sw.P99, sw.Max, sw.AvgBytes = p.N, p.P50, p.P99, p.Max, bytes/max(pages, 1)
		res.Sweeps = append(res.Sweeps, sw)
	}
	_, res.RSSPeak, _ = rss(cmd.Process.Pid)
	return res, nil
}

// readJSON decodes resp's body into v (when it is 200) and returns the
// body's length.
func readJSON(resp *http.Response, v any) (int, error) {
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return len(body), err
	}
	return len(body), json.Unmarshal(body, v)
}
