package web_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/transport/eventfeed"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// open opens the browser's live stream after `after` and returns the
// answer; a stream is left open until the test ends.
func (b *browser) open(t *testing.T, after string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", b.in.url+"/events?after="+after, nil)
	c := *b.c
	c.Timeout = 0
	timer := time.AfterFunc(10*time.Second, cancel)
	defer timer.Stop()
	resp, err := c.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close(); cancel() })
	return resp
}

// One person holds at most MaxStreams live streams: one more is 429
// TOO_MANY_STREAMS, another person still gets theirs; a position beyond
// the events stream is 400.
func TestLiveStreamsPerPersonAreCapped(t *testing.T) {
	in := startInbox(t, func(c *web.Config) { c.MaxStreams = 2 })
	alice, alice2, bob := in.browser(), in.browser(), in.browser()
	alice.signIn("alice")
	alice2.signIn("alice") // another session of the same person
	bob.signIn("bob")
	for _, b := range []*browser{alice, alice2} {
		if resp := b.open(t, "0"); resp.StatusCode != http.StatusOK {
			t.Fatalf("a stream of alice's: %d", resp.StatusCode)
		}
	}
	resp := alice.open(t, "0")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Tollgate-Code") != string(eventfeed.CodeTooManyStreams) {
		t.Fatalf("alice's third stream: %d %s", resp.StatusCode, resp.Header.Get("Tollgate-Code"))
	}
	if resp := bob.open(t, "0"); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob, beside alice at her cap: %d", resp.StatusCode)
	}
	for _, after := range []string{"18446744073709551615", "99999999", "-1"} {
		if resp := bob.open(t, after); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("after=%s: %d, want 400", after, resp.StatusCode)
		}
	}
}
