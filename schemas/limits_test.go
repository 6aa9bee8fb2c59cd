package schemas_test

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestTheCallsOfOneMessageShareAnArgsBudget(t *testing.T) {
	m := exampleInbound()
	m.Calls = nil
	for range schemas.MaxTotalArgsBytes/schemas.MaxArgsBytes + 1 {
		m.Calls = append(m.Calls, schemas.ProposedCall{Tool: "echo", Args: strings.Repeat("x", schemas.MaxArgsBytes)})
	}
	if _, err := schemas.Encode(m); schemas.CodeOf(err) != schemas.CodePayloadTooLarge {
		t.Fatalf("Encode of %d calls at the per-call limit: %v, want PAYLOAD_TOO_LARGE", len(m.Calls), err)
	}
	m.Calls = m.Calls[:len(m.Calls)-1]
	if _, err := schemas.Encode(m); err != nil {
		t.Fatalf("exactly the total budget must be accepted: %v", err)
	}
}

func TestEncodeRefusesARecordThatCouldNeverBeStored(t *testing.T) {
	b := exampleBatch()
	for i := range b.Results {
		r := *b.Results[0]
		r.Output = strings.Repeat("y", schemas.MaxPayloadBytes)
		b.Results[i] = &r
	}
	if _, err := schemas.Encode(b); schemas.CodeOf(err) != schemas.CodePayloadTooLarge {
		t.Fatalf("Encode of an over-size batch record: %v, want PAYLOAD_TOO_LARGE (a permanent error, not a broker retry)", err)
	}
}
