package natsconf_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// TestLeastPrivilegeGatewayKeepsWebSessions: under the least-privilege
// accounts the gateway user, which serves the web inbox, creates, reads,
// updates (compare-and-set), purges and watches records of the web
// sessions bucket with its own grants, a watch of one key and one of two
// keys (an open page's session and its person's revoke key); it runs the
// inbox on them (a dev sign-in, a live stream that the sign-out ends
// through that watch, the heartbeat being an hour off), without one
// refusal; and no other user may read, write or watch that bucket.
func TestLeastPrivilegeGatewayKeepsWebSessions(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	gw := dial(t, ns, "gateway")
	adminSessions, err := admin.js.KeyValue(ctx(t, wait), topology.BucketWebSessions)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t, wait)

	kv, err := gw.js.KeyValue(c, topology.BucketWebSessions)
	if err != nil {
		t.Fatalf("gateway: bucket %s: %v (server said %v)", topology.BucketWebSessions, err, gw.reported())
	}
	sKey, uKey := "s.lp-check", "u.lp-check"
	one, err := kv.Watch(c, sKey, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatalf("gateway: watch %s: %v (server said %v)", sKey, err, gw.reported())
	}
	both, err := kv.WatchFiltered(c, []string{sKey, uKey}, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatalf("gateway: watch %s and %s: %v (server said %v)", sKey, uKey, err, gw.reported())
	}

	type change struct {
		key string
		op  jetstream.KeyValueOp
		rev uint64
	}
	put, purge := jetstream.KeyValuePut, jetstream.KeyValuePurge
	var writes []change // every write, in order
	rev, err := kv.Create(c, sKey, []byte(`{"csrf":"a"}`), jetstream.KeyTTL(time.Hour))
	if err != nil {
		t.Fatalf("gateway: create %s: %v (server said %v)", sKey, err, gw.reported())
	}
	writes = append(writes, change{sKey, put, rev})
	if e, err := kv.Get(c, sKey); err != nil || string(e.Value()) != `{"csrf":"a"}` || e.Revision() != rev {
		t.Fatalf("gateway: get %s: %v, %v", sKey, e, err)
	}
	rev2, err := kv.Update(c, sKey, []byte(`{"csrf":"b"}`), rev)
	if err != nil {
		t.Fatalf("gateway: update %s: %v (server said %v)", sKey, err, gw.reported())
	}
	writes = append(writes, change{sKey, put, rev2})
	// A stale revision is the stream's refusal, not the server's.
	if _, err := kv.Update(c, sKey, []byte(`{"csrf":"c"}`), rev); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("gateway: update %s at a stale revision: want %v, got %v", sKey, jetstream.ErrKeyExists, err)
	}
	if err := kv.Purge(c, sKey, jetstream.LastRevision(rev2), jetstream.PurgeTTL(time.Hour)); err != nil {
		t.Fatalf("gateway: purge %s: %v (server said %v)", sKey, err, gw.reported())
	}
	if e, err := adminSessions.Get(c, sKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("%s after the purge: %v, %v", sKey, e, err)
	}
	writes = append(writes, change{sKey, purge, rev2 + 1})
	// The revoke key as sign-out everywhere writes it: over its own purge.
	for i, op := range []func() (change, error){
		func() (change, error) {
			r, err := kv.Create(c, uKey, []byte(`{"before":1}`), jetstream.KeyTTL(time.Hour))
			return change{uKey, put, r}, err
		},
		func() (change, error) {
			return change{uKey, purge, 0}, kv.Purge(c, uKey, jetstream.PurgeTTL(time.Hour))
		},
		func() (change, error) {
			r, err := kv.Create(c, uKey, []byte(`{"before":2}`), jetstream.KeyTTL(time.Hour))
			return change{uKey, put, r}, err
		},
	} {
		w, err := op()
		if err != nil {
			t.Fatalf("gateway: write %d of %s: %v (server said %v)", i, uKey, err, gw.reported())
		}
		if w.rev == 0 { // a purge's revision: the one after the write before it
			w.rev = writes[len(writes)-1].rev + 1
		}
		writes = append(writes, w)
	}

	// What a watch is sure to see. A KV purge is a rollup: storing its
	// marker deletes the key's earlier revisions, so a watch (a consumer)
	// that had not yet been sent one of them never sees it (JetStream
	// delivers what the stream still holds). That is what made this test
	// fail about once in 10-15 loaded runs (investigated for issue 35,
	// with the exact sequences: the two-key watch saw [s put, s put,
	// s purge, u purge, u put], missing u's FIRST create, deleted by u's
	// purge before delivery, and the one-key watch once [s put, s purge]).
	// It is JetStream's documented behaviour, not a lost update: the
	// latest revision of each key is never deleted by an earlier write, so
	// every watch sees each key's last change, and every purge marker that
	// no later purge replaced. The inbox relies on exactly that: any
	// change of the session's or the person's revoke key makes it read the
	// session again (watchSession), and the heartbeat reads it anyway.
	// The watch must show the surviving writes, in order, and nothing that
	// was not written.
	changes := func(w jetstream.KeyWatcher, keys ...string) {
		t.Helper()
		var want, sure []change
		for i, c := range writes {
			if !slices.Contains(keys, c.key) {
				continue
			}
			want = append(want, c)
			// Sure to be seen: a purge, or the key's last write.
			later := slices.ContainsFunc(writes[i+1:], func(o change) bool { return o.key == c.key })
			if c.op == purge || !later {
				sure = append(sure, c)
			}
		}
		var got []change
		deadline := jstest.After(wait)
		for len(got) == 0 || got[len(got)-1] != want[len(want)-1] {
			select {
			case e := <-w.Updates():
				if e != nil {
					got = append(got, change{e.Key(), e.Operation(), e.Revision()})
				}
			case <-deadline:
				t.Fatalf("watch of %v: %v within %v, want the last write %v (server said %v)", keys, got, wait, want[len(want)-1], gw.reported())
			}
		}
		for i, g := range got {
			if !slices.Contains(want, g) || i > 0 && g.rev <= got[i-1].rev {
				t.Fatalf("watch of %v: %v, want writes of %v in order", keys, got, want)
			}
		}
		for _, s := range sure {
			if !slices.Contains(got, s) {
				t.Fatalf("watch of %v: %v, missing %v (writes %v)", keys, got, s, want)
			}
		}
	}
	changes(one, sKey)
	changes(both, sKey, uKey)
	for _, w := range []jetstream.KeyWatcher{one, both} {
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the gateway's watch consumers are deleted", func(c context.Context) bool {
		s, err := admin.js.Stream(c, "KV_"+topology.BucketWebSessions)
		if err != nil {
			return false
		}
		info, err := s.Info(c)
		return err == nil && info.State.Consumers == 0
	})

	t.Run("the gateway serves the inbox's sessions", func(t *testing.T) {
		inbox, err := web.New(web.Config{JS: gw.js, Policy: policy.Default(), Keys: pipelinetest.Keys(t), Logger: pipelinetest.Logger(),
			Addr: "127.0.0.1:0", DevSignIn: true, Heartbeat: time.Hour})
		if err != nil {
			t.Fatalf("web.New as gateway: %v (server said %v)", err, gw.reported())
		}
		srv := httptest.NewServer(inbox)
		defer srv.Close()
		b := newBrowser(t, srv.URL)
		b.do("GET", "/signin", nil)
		b.do("POST", "/signin/dev", url.Values{"subject": {"alice"}})
		if code := b.status("/session"); code != http.StatusNoContent {
			t.Fatalf("GET /session after the sign-in: %d, want 204 (server said %v)", code, gw.reported())
		}
		// The live stream: it ends when the session does, told by the
		// watch of the session's keys (the heartbeat, which also checks,
		// is an hour off).
		lctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(lctx, "GET", srv.URL+"/events?after=0", nil)
		resp, err := b.c.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /events: %v, %v", resp, err)
		}
		ended := make(chan string, 1)
		go func() {
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			ended <- string(body)
		}()
		// The watch exists once the stream has started: a consumer on the
		// bucket's stream.
		eventually(t, "the live page's session watch", func(c context.Context) bool {
			info := streamInfo(t, admin, "KV_"+topology.BucketWebSessions)
			return info.State.Consumers == 1
		})
		b.do("POST", "/signout", url.Values{})
		select {
		case body := <-ended:
			if !strings.Contains(body, "event: signedout") {
				t.Fatalf("the live stream ended without a signedout event: %q", body)
			}
		case <-jstest.After(wait):
			t.Fatalf("the live stream outlived the sign-out by %v (server said %v)", wait, gw.reported())
		}
		if code := b.status("/session"); code != http.StatusUnauthorized {
			t.Fatalf("GET /session after the sign-out: %d, want 401", code)
		}
	})
	if errs := gw.reported(); len(errs) > 0 {
		t.Fatalf("the gateway user was refused: %v", errs)
	}

	// The stages look every bucket up at start (topology.Ensure), this
	// one included, and no more; the transports do not even look it up.
	slack, executor := dial(t, ns, "slack"), dial(t, ns, "executor")
	cases := []refusal{noRequest("slack cannot look the web sessions bucket up", slack, apiOf(slack)+"STREAM.INFO.KV_"+topology.BucketWebSessions)}
	for _, u := range []*client{slack, executor} {
		cases = append(cases,
			noRead(u.user+" cannot read a web session", u, topology.BucketWebSessions, uKey),
			noWrite(u.user+" cannot write a web session", u, adminSessions, "s.forged-by-"+u.user),
			noRequest(u.user+" cannot watch the web sessions", u, apiOf(u)+"CONSUMER.CREATE.KV_"+topology.BucketWebSessions+".w-"+u.user+".$KV."+topology.BucketWebSessions+".>"),
		)
	}
	runRefusals(t, cases)
}

// browser is a user agent of the inbox: a cookie jar and the CSRF token
// of the last page it read.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, Timeout: wait}}
}

// do sends a request (a form, with the page's CSRF token and Origin, when
// form is not nil), follows redirects, wants 200 and keeps the page's
// CSRF token.
func (b *browser) do(method, path string, form url.Values) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		form.Set("csrf", b.csrf)
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, b.base+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, page)
	}
	if m := csrfField.FindSubmatch(page); m != nil {
		b.csrf = string(m[1])
	}
}

// status is the status of a GET of path.
func (b *browser) status(path string) int {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
