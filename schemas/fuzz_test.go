package schemas_test

import (
	"reflect"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Decoder fuzzers. Seeds are the golden files; the properties are:
//   - Decode never panics;
//   - a failure carries a reason code (so a worker can dead-letter it);
//   - a success re-encodes, and decoding that again yields the same value.
//
// Run one with e.g. go test -run=^$ -fuzz=FuzzDecodeDecision -fuzztime=15s ./schemas

func fuzzDecode[T any, P schemas.Ptr[T]](f *testing.F, golden string) {
	for _, rt := range recordTypes {
		// Every golden file is a seed: the other types' shapes are good
		// starting points for confusion between record types.
		f.Add(readGolden(f, rt.golden))
	}
	g := readGolden(f, golden)
	// One seed per key of the record with that key's value set to nil: a
	// nil where the decoder expects a struct, a slice or a timestamp is a
	// classic decoder crash, and mutation alone rarely gets there.
	for key := range toMap(f, g) {
		m := toMap(f, g)
		m[key] = nil
		f.Add(fromMap(f, m))
	}
	f.Add(g[:len(g)/2])
	f.Add([]byte{})
	f.Add([]byte{0x80})
	f.Add([]byte{0x81, 0xa1, 'v', 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := schemas.Decode[T, P](b)
		if err != nil {
			if schemas.CodeOf(err) == "" {
				t.Fatalf("error without a reason code: %v", err)
			}
			if v != nil {
				t.Fatalf("value returned with the error %v", err)
			}
			return
		}
		if v == nil {
			t.Fatal("nil value without an error")
		}
		want := utc(*v)
		out, err := schemas.Encode(P(v))
		if err != nil {
			t.Fatalf("decoded value does not encode: %v", err)
		}
		v2, err := schemas.Decode[T, P](out)
		if err != nil {
			t.Fatalf("re-encoded value does not decode: %v\n%x", err, out)
		}
		if got := utc(*v2); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip changed the value\n got %#v\nwant %#v", got, want)
		}
	})
}

func FuzzDecodeInboundMessage(f *testing.F) {
	fuzzDecode[schemas.InboundMessage](f, "inbound_message.v1.msgpack")
}

func FuzzDecodeTurnContext(f *testing.F) {
	fuzzDecode[schemas.TurnContext](f, "turn_context.v1.msgpack")
}

func FuzzDecodeAcceptedTurn(f *testing.F) {
	fuzzDecode[schemas.AcceptedTurn](f, "accepted_turn.v1.msgpack")
}

func FuzzDecodeDecision(f *testing.F) {
	fuzzDecode[schemas.Decision](f, "decision.v1.msgpack")
}

func FuzzDecodeApprovalRecord(f *testing.F) {
	fuzzDecode[schemas.ApprovalRecord](f, "approval_record.v2.msgpack")
}

func FuzzDecodeDecidedEvent(f *testing.F) {
	fuzzDecode[schemas.DecidedEvent](f, "decided_event.v1.msgpack")
}

func FuzzDecodeVotedEvent(f *testing.F) {
	fuzzDecode[schemas.VotedEvent](f, "voted_event.v1.msgpack")
}

func FuzzDecodeDecisionRejected(f *testing.F) {
	fuzzDecode[schemas.DecisionRejected](f, "decision_rejected.v1.msgpack")
}

func FuzzDecodeRedriveOutcome(f *testing.F) {
	fuzzDecode[schemas.RedriveOutcome](f, "redrive_outcome.v1.msgpack")
}

func FuzzDecodeTurnOutcome(f *testing.F) {
	fuzzDecode[schemas.TurnOutcome](f, "turn_outcome.v1.msgpack")
}

func FuzzDecodeBatchRecord(f *testing.F) {
	fuzzDecode[schemas.BatchRecord](f, "batch_record.v2.msgpack")
}

func FuzzDecodePlannerTurn(f *testing.F) {
	fuzzDecode[schemas.PlannerTurn](f, "planner_turn.v1.msgpack")
}

func FuzzDecodeBatchRecordV1(f *testing.F) {
	fuzzDecode[schemas.BatchRecordV1](f, "batch_record.v1.msgpack")
}

// FuzzDecodeBatch: the version dispatcher never panics, marks exactly the
// version 1 records Legacy, never returns a legacy record with claims, and
// every failure carries a code.
func FuzzDecodeBatch(f *testing.F) {
	for _, rt := range recordTypes {
		f.Add(readGolden(f, rt.golden))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := schemas.DecodeBatch(b)
		switch {
		case err != nil:
			if schemas.CodeOf(err) == "" || rec != nil {
				t.Fatalf("err %v with rec %v", err, rec)
			}
		case rec == nil:
			t.Fatal("no record and no error")
		case rec.Legacy() != (rec.V == schemas.BatchLegacyVersion), !rec.Legacy() && rec.V != schemas.BatchVersion:
			t.Fatalf("version %d returned with legacy %v", rec.V, rec.Legacy())
		case rec.Legacy() && len(rec.Claims) != 0:
			t.Fatal("a legacy record with claims")
		}
	})
}

func FuzzDecodeSessionRecord(f *testing.F) {
	fuzzDecode[schemas.SessionRecord](f, "session_record.v1.msgpack")
}

func FuzzDecodeExecutionClaim(f *testing.F) {
	fuzzDecode[schemas.ExecutionClaim](f, "execution_claim.v1.msgpack")
}

func FuzzDecodeTurnNotice(f *testing.F) {
	fuzzDecode[schemas.TurnNotice](f, "turn_notice.v1.msgpack")
}

func FuzzCanonicalArgs(f *testing.F) {
	for _, s := range []string{
		"", "{}", exArgs, exArgs2,
		`{"b":1,"a":[1,2,{"d":null,"c":true}]}`,
		`{"s":"caf\u00e9 \ud83d\ude00 <>&"}`,
		`{"n":-0.0e+00}`, `[1]`, `null`, `{"a":1}{`, "{\"a\":\"\xff\"}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, d, err := schemas.CanonicalArgs(raw)
		if err != nil {
			if schemas.CodeOf(err) == "" {
				t.Fatalf("error without a reason code: %v", err)
			}
			if c != "" || d != "" {
				t.Fatalf("output with the error %v", err)
			}
			return
		}
		if d != schemas.ArgsDigest(c) {
			t.Fatalf("digest %s is not the digest of %s", d, c)
		}
		if len(c) > schemas.MaxArgsBytes {
			return // canonicalising can grow the input (an invalid byte becomes \ufffd)
		}
		c2, d2, err := schemas.CanonicalArgs(c)
		if err != nil {
			t.Fatalf("canonical form %q is rejected: %v", c, err)
		}
		if c2 != c || d2 != d {
			t.Fatalf("canonical form is not a fixed point:\n%s\n%s", c, c2)
		}
	})
}

func FuzzDecodeApprovalRecordV1(f *testing.F) {
	fuzzDecode[schemas.ApprovalRecordV1](f, "approval_record.v1.msgpack")
}

// FuzzDecodeApproval: the version dispatcher never panics, returns exactly
// one of a current or a legacy record, and every failure carries a code.
func FuzzDecodeApproval(f *testing.F) {
	for _, rt := range recordTypes {
		f.Add(readGolden(f, rt.golden))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, old, err := schemas.DecodeApproval(b)
		switch {
		case err != nil:
			if schemas.CodeOf(err) == "" || rec != nil || old != nil {
				t.Fatalf("err %v with rec %v old %v", err, rec, old)
			}
		case (rec == nil) == (old == nil):
			t.Fatalf("want exactly one of rec and old: %v %v", rec, old)
		case rec != nil && rec.V != schemas.ApprovalVersion, old != nil && old.V != schemas.ApprovalLegacyVersion:
			t.Fatal("a record of the wrong version was returned")
		}
	})
}

func FuzzDecodeGrant(f *testing.F) {
	fuzzDecode[schemas.Grant](f, "grant.v1.msgpack")
}

func FuzzDecodeGrantIndex(f *testing.F) {
	fuzzDecode[schemas.GrantIndex](f, "grant_index.v1.msgpack")
}

func FuzzDecodeGrantEvent(f *testing.F) {
	fuzzDecode[schemas.GrantEvent](f, "grant_event.v1.msgpack")
}
