package schemas_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func BenchmarkEncodeApprovalRecord(b *testing.B) {
	a := exampleApproval()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schemas.Encode(a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeApprovalRecord(b *testing.B) {
	data := readGolden(b, "approval_record.v2.msgpack")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schemas.Decode[schemas.ApprovalRecord](data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeInboundMessage(b *testing.B) {
	data := readGolden(b, "inbound_message.v1.msgpack")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schemas.Decode[schemas.InboundMessage](data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalArgs(b *testing.B) {
	raw := `{"to":["cfo@example.com","ceo@example.com"],"subject":"Q1","body":"Quarterly numbers attached.","attachments":[{"path":"/reports/q1.pdf","size":48213}],"urgent":false}`
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := schemas.CanonicalArgs(raw); err != nil {
			b.Fatal(err)
		}
	}
}
