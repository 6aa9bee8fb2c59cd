package store_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
)

// TestAnEndingWriteCarriesATTLAndNoRollup: the write that ends a record
// (here a claim's result) is stored with the Nats-TTL header of the
// retention and without a Nats-Rollup header, as docs/protocol.md §4.2
// and operations.md ("Retention") say; its live revision carries neither.
func TestAnEndingWriteCarriesATTLAndNoRollup(t *testing.T) {
	env := jstest.Start(t)
	s := store.New(env.Buckets)
	s.Retain(env.JS, retention)
	ctx := jstest.Ctx(t)
	stream, err := env.JS.Stream(ctx, "KV_"+s.Claims.KV.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	headers := func(callID string) (ttl, rollup string) {
		t.Helper()
		m, err := stream.GetLastMsgForSubject(ctx, "$KV."+s.Claims.KV.Bucket()+"."+callID)
		if err != nil {
			t.Fatal(err)
		}
		return m.Header.Get(jetstream.MsgTTLHeader), m.Header.Get(jetstream.MsgRollup)
	}
	c := claim("t-live-0", "w1")
	if _, err := s.Claims.Create(ctx, c.CallID, c); err != nil {
		t.Fatal(err)
	}
	if ttl, rollup := headers(c.CallID); ttl != "" || rollup != "" {
		t.Fatalf("a live claim stored with Nats-TTL %q, Nats-Rollup %q; want neither", ttl, rollup)
	}
	ran, _ := ranClaim(ctx, t, s, "t-ran-0")
	if ttl, rollup := headers(ran.CallID); ttl != retention.String() || rollup != "" {
		t.Fatalf("an ended claim stored with Nats-TTL %q, Nats-Rollup %q; want %s and no rollup", ttl, rollup, retention)
	}
}
