package seal_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

func benchContext() *schemas.TurnContext {
	return &schemas.TurnContext{
		V: schemas.TurnContextVersion, SessionID: "bench-session", TurnID: "t-0123456789abcdef0123",
		Requester: schemas.Requester{Principal: "slack:U02ABCDEF", SenderID: "U02ABCDEF", Kind: schemas.SenderUser, Verified: true},
		Transport: "slack", Channel: schemas.Channel{ID: "C0123ABC", Kind: schemas.ChannelPrivate},
		Audience: schemas.AudienceTeam, TrustBoundary: "acme", Interactive: true,
		Provenance: schemas.Provenance{Transport: "slack", MessageID: "m-1", StreamSeq: 42, ReceivedAt: time.Unix(1700000000, 0), IngestedBy: "ingest@x"},
		CreatedAt:  time.Unix(1700000000, 0),
	}
}

// BenchmarkSeal and BenchmarkVerify are the per-turn and per-check cost of
// the seal (canonical encoding plus HMAC-SHA256).
func BenchmarkSeal(b *testing.B) {
	r, err := seal.NewFile("k1").Ring()
	if err != nil {
		b.Fatal(err)
	}
	tc := benchContext()
	b.ReportAllocs()
	for b.Loop() {
		if err := r.Seal(tc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	r, err := seal.NewFile("k1").Ring()
	if err != nil {
		b.Fatal(err)
	}
	tc := benchContext()
	if err := r.Seal(tc); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := r.Verify(tc); err != nil {
			b.Fatal(err)
		}
	}
}
