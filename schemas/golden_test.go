package schemas_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the examples")

func goldenPath(name string) string { return filepath.Join("testdata", name) }

func readGolden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(goldenPath(name))
	if err != nil {
		t.Fatalf("read golden file (generate with go test ./schemas -run TestGolden -update): %v", err)
	}
	return b
}

// TestGolden pins the wire format: each example encodes to exactly the bytes
// of its golden file, and each golden file decodes to exactly its example.
// A failure here means the encoding of a persisted or published record
// changed; if that is intended, bump the record's version.
func TestGolden(t *testing.T) {
	for _, rt := range recordTypes {
		t.Run(rt.golden, func(t *testing.T) {
			got, err := schemas.Encode(rt.example())
			if err != nil {
				t.Fatalf("encode example: %v", err)
			}
			// The readable sibling shows the wire keys, as docs/protocol.md does.
			pretty, err := json.MarshalIndent(utc(toMap(t, got)), "", "  ")
			if err != nil {
				t.Fatalf("json: %v", err)
			}
			pretty = append(pretty, '\n')
			jsonName := strings.TrimSuffix(rt.golden, ".msgpack") + ".json"
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(goldenPath(rt.golden), got, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(goldenPath(jsonName), pretty, 0o644); err != nil {
					t.Fatal(err)
				}
			}

			want := readGolden(t, rt.golden)
			if !bytes.Equal(got, want) {
				t.Errorf("encoding differs from testdata/%s\n got %x\nwant %x", rt.golden, got, want)
			}

			fromGolden, err := rt.decode(want)
			if err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			if ex := rt.example(); !reflect.DeepEqual(utc(fromGolden), utc(ex)) {
				t.Errorf("golden decodes to\n%#v\nwant\n%#v", fromGolden, ex)
			}

			generic := toMap(t, want)
			if v := reflect.ValueOf(generic["v"]); !v.CanInt() && !v.CanUint() || fmt.Sprint(v) != strconv.Itoa(rt.version) {
				t.Errorf(`golden "v" = %v, want %d (the version in its file name)`, generic["v"], rt.version)
			}
			skip := map[string]bool{}
			if rt.golden == "approval_record.v1.msgpack" {
				skip[".decision.grant"] = true // the legacy shape predates grants
				skip[".decision.note"] = true  // and notes kept with the decision
			}
			if rt.golden == "batch_record.v1.msgpack" {
				skip[".claims"] = true  // version 1 kept its claims in tollgate_claims
				skip[".outcome"] = true // and published its outcome only
			}
			if strings.HasPrefix(rt.golden, "batch_record.") && rt.golden != "batch_record.v2-awaiting.msgpack" {
				skip[".requested"] = true // only the move to awaiting carries its requests
			}
			if strings.HasPrefix(rt.golden, "batch_record.") && rt.golden != "batch_record.v2-started.msgpack" {
				skip[".decided"] = true // only the move to started carries its decisions
			}
			if rt.golden == "batch_record.v2-started.msgpack" {
				// Started: nothing ended, the approved call not yet run.
				for _, k := range []string{".outcome", ".code", ".reason", ".results", ".decided[].repeat"} {
					skip[k] = true
				}
			}
			if strings.HasPrefix(rt.golden, "batch_record.") && rt.golden != "batch_record.v2-ordered.msgpack" {
				skip[".order_seq"] = true // written before a session's order, or not an entry
				skip[".order_after"] = true
			}
			if rt.golden == "batch_record.v2-ordered.msgpack" {
				// Queued: nothing ran, nothing was claimed or ended.
				for _, k := range []string{".outcome", ".code", ".reason", ".results", ".claims", ".approvals"} {
					skip[k] = true
				}
			}
			if rt.golden == "batch_record.v2-awaiting.msgpack" {
				// Not ended yet: no outcome, code or reason, and the
				// waiting call has no result (batch_record.v2 has them).
				for _, k := range []string{".outcome", ".code", ".reason", ".results"} {
					skip[k] = true
				}
				// Each request is kept summary-only, without the context
				// and arguments, which are the batch's.
				for _, k := range []string{"context", "args", "preview.text", "preview.reason", "preview.lines"} {
					skip[".requested[]."+k] = true
				}
			}
			if rt.golden == "approval_record.v2.msgpack" {
				skip[".preview"] = true // a record written before previews (v2-preview has one)
			}
			if rt.golden == "approval_record.v2-preview.msgpack" {
				// A stored preview is whole: the counts are the summary-only
				// form's (v2-preview-summary).
				for _, k := range []string{"redacted", "added", "removed", "lines"} {
					skip[".preview."+k] = true
				}
			}
			if rt.golden == "approval_record.v2-preview-summary.msgpack" {
				// The summary-only form (the approval-requested event's) has
				// no content, and a diff's counts are added and removed.
				for _, k := range []string{"text", "reason", "lines"} {
					skip[".preview."+k] = true
				}
			}
			assertAllKeys(t, "", reflect.TypeOf(rt.example()), generic, skip)

			readable, err := os.ReadFile(goldenPath(jsonName))
			if err != nil {
				t.Fatalf("read readable sibling: %v", err)
			}
			if !bytes.Equal(readable, pretty) {
				t.Errorf("testdata/%s is out of date; regenerate with -update", jsonName)
			}
		})
	}
}

// assertAllKeys fails unless every msgpack field of typ (recursively) is
// present in the generic decoding v: the examples must stay fully populated
// so that every key is pinned by a golden file.
func assertAllKeys(t *testing.T, path string, typ reflect.Type, v any, skip map[string]bool) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch typ.Kind() {
	case reflect.Struct:
		if typ == reflect.TypeOf(time.Time{}) {
			if _, ok := v.(time.Time); !ok {
				t.Errorf("%s: %T, want a msgpack timestamp", path, v)
			}
			return
		}
		m, ok := v.(map[string]any)
		if !ok {
			t.Errorf("%s: %T, want a map", path, v)
			return
		}
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if !f.IsExported() {
				continue // not encoded (a BatchRecord's legacy mark)
			}
			name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
			fv, ok := m[name]
			if skip[path+"."+name] {
				continue
			}
			if !ok || fv == nil {
				t.Errorf("%s.%s: missing from the golden file; populate it in the example", path, name)
				continue
			}
			assertAllKeys(t, path+"."+name, f.Type, fv, skip)
		}
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 { // []byte encodes as msgpack bin
			if b, ok := v.([]byte); !ok || len(b) == 0 {
				t.Errorf("%s: %T, want non-empty bytes", path, v)
			}
			return
		}
		s, ok := v.([]any)
		if !ok || len(s) == 0 {
			t.Errorf("%s: %T, want a non-empty array", path, v)
			return
		}
		// A key counts as pinned if any element carries it.
		merged := map[string]any{}
		for i, e := range s {
			em, ok := e.(map[string]any)
			if !ok {
				assertAllKeys(t, path+"["+strconv.Itoa(i)+"]", typ.Elem(), e, skip)
				continue
			}
			for k, x := range em {
				if merged[k] == nil {
					merged[k] = x
				}
			}
		}
		if len(merged) > 0 {
			assertAllKeys(t, path+"[]", typ.Elem(), merged, skip)
		}
	}
}

// toMap decodes b generically.
func toMap(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode as map: %v", err)
	}
	return m
}

func fromMap(t testing.TB, m any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatalf("encode map: %v", err)
	}
	return b
}

func wantCode(t *testing.T, err error, want schemas.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", want)
	}
	if got := schemas.CodeOf(err); got != want {
		t.Fatalf("got code %q (%v), want %s", got, err, want)
	}
}

func TestDecodeRejectsUnknownVersions(t *testing.T) {
	for _, rt := range recordTypes {
		other := 2 // the version after the current one
		if rt.version == 2 {
			other = 3
		}
		cases := []struct {
			name string
			v    any // nil: key absent
		}{
			{"missing version", nil},
			{"version zero", 0},
			{"next version", other},
			{"version 99", 99},
			{"largest version", 65535},
		}
		if rt.version == 2 {
			cases = append(cases, struct {
				name string
				v    any
			}{"version 1, reserved for the legacy shape", 1})
		}
		for _, tc := range cases {
			t.Run(rt.golden+"/"+tc.name, func(t *testing.T) {
				m := toMap(t, readGolden(t, rt.golden))
				if tc.v == nil {
					delete(m, "v")
				} else {
					m["v"] = tc.v
				}
				rec, err := rt.decode(fromMap(t, m))
				wantCode(t, err, schemas.CodeSchemaVersionUnsupported)
				if rec != nil {
					t.Errorf("got a record %#v with the error", rec)
				}
			})
		}
	}
}

// A legacy (v1) approval record has no persisted TurnContext. It must be
// rejected as an unsupported version, never read as a v2 record without
// authority.
func TestDecodeLegacyApprovalRecord(t *testing.T) {
	m := toMap(t, readGolden(t, "approval_record.v2.msgpack"))
	m["v"] = 1
	delete(m, "context")
	_, err := schemas.Decode[schemas.ApprovalRecord](fromMap(t, m))
	wantCode(t, err, schemas.CodeSchemaVersionUnsupported)

	// DecodeApproval hands a v1 record to the compatibility path, a v2 one
	// through, and anything else is rejected, never guessed.
	rec, old, err := schemas.DecodeApproval(readGolden(t, "approval_record.v1.msgpack"))
	if err != nil || rec != nil || old == nil || old.Sender == nil || old.Audience != schemas.AudienceTeam {
		t.Fatalf("v1 golden: rec %v old %+v err %v", rec, old, err)
	}
	rec, old, err = schemas.DecodeApproval(readGolden(t, "approval_record.v2.msgpack"))
	if err != nil || rec == nil || old != nil || rec.Context == nil {
		t.Fatalf("v2 golden: rec %v old %v err %v", rec, old, err)
	}
	for _, v := range []int{0, 3, 65535} {
		m := toMap(t, readGolden(t, "approval_record.v2.msgpack"))
		m["v"] = v
		_, _, err := schemas.DecodeApproval(fromMap(t, m))
		wantCode(t, err, schemas.CodeSchemaVersionUnsupported)
	}
}

// followup_depth was added to version 1 of the accepted turn and the batch
// record as an optional key: a record written before it still decodes, as
// depth 0, with every other field intact.
func TestDecodeRecordsWrittenBeforeFollowUpDepth(t *testing.T) {
	for _, golden := range []string{"accepted_turn.v1.msgpack", "batch_record.v2.msgpack"} {
		t.Run(golden, func(t *testing.T) {
			m := toMap(t, readGolden(t, golden))
			if _, ok := m["followup_depth"]; !ok {
				t.Fatal("the golden file has no followup_depth to remove")
			}
			delete(m, "followup_depth")
			rec, err := decoderFor(t, golden)(fromMap(t, m))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			var want schemas.Record
			switch r := rec.(type) {
			case *schemas.AcceptedTurn:
				if r.FollowUpDepth != 0 {
					t.Errorf("followup_depth %d, want 0", r.FollowUpDepth)
				}
				ex := exampleAccepted()
				ex.FollowUpDepth = 0
				want = ex
			case *schemas.BatchRecord:
				if r.FollowUpDepth != 0 {
					t.Errorf("followup_depth %d, want 0", r.FollowUpDepth)
				}
				ex := exampleBatch()
				ex.FollowUpDepth = 0
				want = ex
			default:
				t.Fatalf("decoded a %T", rec)
			}
			if !reflect.DeepEqual(utc(rec), utc(want)) {
				t.Errorf("decoded\n%#v\nwant\n%#v", rec, want)
			}
		})
	}
}

// trace was added to version 2 of the approval record as an optional key:
// a record written before it (or with tracing off) decodes with no trace
// context, every other field intact.
func TestDecodeAnApprovalWrittenBeforeTrace(t *testing.T) {
	m := toMap(t, readGolden(t, "approval_record.v2.msgpack"))
	if _, ok := m["trace"]; !ok {
		t.Fatal("the golden file has no trace to remove")
	}
	delete(m, "trace")
	rec, err := schemas.Decode[schemas.ApprovalRecord](fromMap(t, m))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := exampleApproval()
	want.Trace = nil
	if !reflect.DeepEqual(utc(rec), utc(want)) {
		t.Errorf("decoded\n%#v\nwant\n%#v", rec, want)
	}
}

// grants (the offers of a prompt) and decision.grant were added to version 2
// of the approval record, and decision.grant to version 1 of the decided
// event, as optional keys: a record written before them decodes with no
// offers and no grant, every other field intact.
func TestDecodeRecordsWrittenBeforeGrants(t *testing.T) {
	m := toMap(t, readGolden(t, "approval_record.v2.msgpack"))
	delete(m, "grants")
	delete(m["decision"].(map[string]any), "grant")
	for _, v := range m["votes"].([]any) {
		delete(v.(map[string]any), "grant")
	}
	rec, err := schemas.Decode[schemas.ApprovalRecord](fromMap(t, m))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := exampleApproval()
	want.Grants, want.Decision.Grant = nil, nil
	for i := range want.Votes {
		want.Votes[i].Grant = nil
	}
	if !reflect.DeepEqual(utc(rec), utc(want)) {
		t.Errorf("decoded\n%#v\nwant\n%#v", rec, want)
	}
	e := toMap(t, readGolden(t, "decided_event.v1.msgpack"))
	delete(e["decision"].(map[string]any), "grant")
	ev, err := schemas.Decode[schemas.DecidedEvent](fromMap(t, e))
	if err != nil || ev.Decision == nil || ev.Decision.Grant != nil || ev.Decision.Principal != exampleDecisionInfo().Principal {
		t.Fatalf("decided event without grant: %+v, %v", ev, err)
	}
}

func TestDecodeRejectsMalformedPayloads(t *testing.T) {
	arrayOf := func(t *testing.T, golden string) []byte {
		m := toMap(t, readGolden(t, golden))
		return fromMap(t, []any{m["v"], m["turn_id"]})
	}
	for _, rt := range recordTypes {
		golden := readGolden(t, rt.golden)
		cases := []struct {
			name string
			b    []byte
		}{
			{"empty payload", []byte{}},
			{"nil payload", nil},
			{"first byte only", golden[:1]},
			{"first half", golden[:len(golden)/2]},
			{"all but the last byte", golden[:len(golden)-1]},
			{"one trailing byte", append(bytes.Clone(golden), 0x00)},
			{"two records back to back", append(bytes.Clone(golden), golden...)},
			{"msgpack nil", []byte{0xc0}},
			{"msgpack integer", []byte{0x2a}},
			{"msgpack string", fromMap(t, "hello")},
			{"msgpack array instead of a map", arrayOf(t, rt.golden)},
			{"JSON text", []byte(`{"v":1,"turn_id":"t-1"}`)},
			{"never-used code 0xc1", []byte{0x81, 0xa1, 'v', 0xc1}},
			{"garbage bytes", []byte("\x8f\xde\xad\xbe\xef\x00\xff\x13\x37")},
			{"map claiming more entries than it has", []byte{0x8f, 0xa1, 'v', 0x01}},
		}
		for _, tc := range cases {
			t.Run(rt.golden+"/"+tc.name, func(t *testing.T) {
				rec, err := rt.decode(tc.b)
				wantCode(t, err, schemas.CodeMalformed)
				if rec != nil {
					t.Errorf("got a record %#v with the error", rec)
				}
			})
		}
	}
}

// Random bytes never decode into a record, and every failure carries a code
// a worker can dead-letter with.
func TestDecodeRejectsRandomBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, rt := range recordTypes {
		t.Run(rt.golden, func(t *testing.T) {
			malformed := 0
			for i := 0; i < 200; i++ {
				b := make([]byte, 1+rng.IntN(256))
				for j := range b {
					b[j] = byte(rng.Uint32())
				}
				if i%2 == 0 {
					b[0] = 0x80 | b[0]&0x0f // a fixmap, to get past the first byte
				}
				rec, err := rt.decode(b)
				if err == nil || rec != nil {
					t.Fatalf("random bytes %x decoded to %#v", b, rec)
				}
				switch schemas.CodeOf(err) {
				case schemas.CodeMalformed:
					malformed++
				case schemas.CodeSchemaVersionUnsupported, schemas.CodeInvalidInput, schemas.CodePayloadTooLarge:
				default:
					t.Fatalf("random bytes %x: %v", b, err)
				}
			}
			if malformed < 150 {
				t.Errorf("only %d of 200 random payloads were reported malformed", malformed)
			}
		})
	}
}

func TestDecodeRejectsWrongFieldTypes(t *testing.T) {
	cases := []struct {
		name   string
		golden string
		path   []string // map keys down to the field
		value  any
	}{
		{"inbound transport is a number", "inbound_message.v1.msgpack", []string{"transport"}, 42},
		{"inbound calls is a string", "inbound_message.v1.msgpack", []string{"calls"}, "email.send"},
		{"inbound sender is a string", "inbound_message.v1.msgpack", []string{"sender"}, "U02ABCDEF"},
		{"inbound sent_at is a bool", "inbound_message.v1.msgpack", []string{"sent_at"}, true},
		{"inbound sent_at is not a time", "inbound_message.v1.msgpack", []string{"sent_at"}, "yesterday"},
		{"inbound version is a string", "inbound_message.v1.msgpack", []string{"v"}, "1"},
		{"inbound version beyond 16 bits (would wrap onto 1)", "inbound_message.v1.msgpack", []string{"v"}, 65537},
		{"inbound version is negative", "inbound_message.v1.msgpack", []string{"v"}, -1},
		{"inbound sent_at is nil", "inbound_message.v1.msgpack", []string{"sent_at"}, nil},
		{"approval expires_at is nil", "approval_record.v2.msgpack", []string{"expires_at"}, nil},
		{"context created_at is nil", "approval_record.v2.msgpack", []string{"context", "created_at"}, nil},
		{"decision option is a list", "decision.v1.msgpack", []string{"option"}, []string{"approve"}},
		{"decision decider is a number", "decision.v1.msgpack", []string{"decider"}, 7},
		{"decision verified is a string", "decision.v1.msgpack", []string{"decider", "verified"}, "yes"},
		{"approval context is a string", "approval_record.v2.msgpack", []string{"context"}, "trust me"},
		{"approval options is a number", "approval_record.v2.msgpack", []string{"options"}, 2},
		{"approval requester is a list", "approval_record.v2.msgpack", []string{"context", "requester"}, []int{1}},
		{"approval preview is a string", "approval_record.v2-preview.msgpack", []string{"preview"}, "all fine"},
		{"approval preview text is a number", "approval_record.v2-preview.msgpack", []string{"preview", "text"}, 3},
		{"approval preview at is a string", "approval_record.v2-preview.msgpack", []string{"preview", "at"}, "now"},
		{"batch results is a map", "batch_record.v1.msgpack", []string{"results"}, map[string]any{"0": "ok"}},
		{"session queue holds numbers", "session_record.v1.msgpack", []string{"queue"}, []int{1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := toMap(t, readGolden(t, tc.golden))
			at := m
			for _, k := range tc.path[:len(tc.path)-1] {
				at = at[k].(map[string]any)
			}
			at[tc.path[len(tc.path)-1]] = tc.value
			_, err := decoderFor(t, tc.golden)(fromMap(t, m))
			wantCode(t, err, schemas.CodeMalformed)
		})
	}
}

// A record written before previews existed (the v2 golden file) still
// decodes, with no preview; one with a preview keeps it exactly.
func TestApprovalPreviewIsOptional(t *testing.T) {
	rec, _, err := schemas.DecodeApproval(readGolden(t, "approval_record.v2.msgpack"))
	if err != nil || rec == nil {
		t.Fatalf("decode record without preview: %v", err)
	}
	if rec.Preview != nil {
		t.Fatalf("preview = %+v, want none", rec.Preview)
	}
	rec, _, err = schemas.DecodeApproval(readGolden(t, "approval_record.v2-preview.msgpack"))
	if err != nil || rec == nil || rec.Preview == nil {
		t.Fatalf("decode record with preview: %+v, %v", rec, err)
	}
	if want := exampleApprovalPreview().Preview; rec.Preview.Text != want.Text || rec.Preview.Status != want.Status || !rec.Preview.At.Equal(want.At) {
		t.Fatalf("preview = %+v, want %+v", rec.Preview, want)
	}
}

func decoderFor(t testing.TB, golden string) func([]byte) (schemas.Record, error) {
	t.Helper()
	for _, rt := range recordTypes {
		if rt.golden == golden {
			return rt.decode
		}
	}
	t.Fatalf("no record type for %s", golden)
	return nil
}

// A length header is a claim, not a fact: a tiny payload claiming millions
// of elements or bytes must be rejected without the decoder allocating by
// the claim (it would otherwise take down the worker).
func TestDecodeRejectsLengthClaimsBeyondThePayload(t *testing.T) {
	prefix := []byte{0x82, 0xa1, 'v', 0x01, 0xa5, 'c', 'a', 'l', 'l', 's'} // {"v":1,"calls":
	n := []byte{0x00, 0x40, 0x00, 0x00}                                    // 4 Mi
	cases := []struct {
		name string
		b    []byte
	}{
		{"array32 of calls", append(append(bytes.Clone(prefix), 0xdd), n...)},
		{"array16 of calls", append(bytes.Clone(prefix), 0xdc, 0xff, 0xff)},
		{"map32 value", append(append(bytes.Clone(prefix), 0xdf), n...)},
		{"str32 value", append(append(bytes.Clone(prefix), 0xdb), n...)},
		{"bin32 value", append(append(bytes.Clone(prefix), 0xc6), n...)},
		{"ext32 value", append(append(bytes.Clone(prefix), 0xc9), append(n, 0x01)...)},
		{"top-level map32", append([]byte{0xdf}, n...)},
		{"top-level map16", []byte{0xde, 0xff, 0xff}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := allocated()
			_, err := schemas.Decode[schemas.InboundMessage](tc.b)
			grew := allocated() - before
			wantCode(t, err, schemas.CodeMalformed)
			if grew > 1<<20 {
				t.Errorf("decoding %d bytes allocated %d bytes", len(tc.b), grew)
			}
		})
	}
}

func TestDecodeNestingDepth(t *testing.T) {
	nested := func(depth int) []byte {
		// {"v":1, "future": [[[...]]]} with depth arrays; unknown keys are
		// skipped, so only the depth decides.
		b := []byte{0x82, 0xa1, 'v', 0x01, 0xa6, 'f', 'u', 't', 'u', 'r', 'e'}
		for i := 0; i < depth; i++ {
			b = append(b, 0x91)
		}
		return append(b, 0xc0)
	}
	t.Run("ten thousand levels are malformed", func(t *testing.T) {
		_, err := schemas.Decode[schemas.TurnNotice](nested(10000))
		wantCode(t, err, schemas.CodeMalformed)
	})
	t.Run("a few levels under an unknown key are skipped", func(t *testing.T) {
		_, err := schemas.Decode[schemas.TurnNotice](nested(8))
		// Structurally fine; the record itself lacks its fields.
		wantCode(t, err, schemas.CodeInvalidInput)
	})
}

func TestDecodeIgnoresUnknownKeys(t *testing.T) {
	for _, rt := range recordTypes {
		t.Run(rt.golden, func(t *testing.T) {
			m := toMap(t, readGolden(t, rt.golden))
			m["added_in_a_later_minor_release"] = "x"
			m["zz_future_map"] = map[string]any{"a": []any{1, "two", 3.5, nil}, "b": map[string]any{}}
			if ctx, ok := m["context"].(map[string]any); ok {
				ctx["future_context_field"] = true
			}
			got, err := rt.decode(fromMap(t, m))
			if err != nil {
				t.Fatalf("decode with unknown keys: %v", err)
			}
			if ex := rt.example(); !reflect.DeepEqual(utc(got), utc(ex)) {
				t.Errorf("decoded\n%#v\nwant\n%#v", got, ex)
			}
		})
	}
}

func TestDecodeSizeLimit(t *testing.T) {
	// padded returns the golden inbound message with an unknown key padded so
	// that the encoding is exactly size bytes.
	padded := func(t *testing.T, size int) []byte {
		m := toMap(t, readGolden(t, "inbound_message.v1.msgpack"))
		m["pad"] = ""
		base := len(fromMap(t, m))                  // the empty pad is a 1-byte fixstr
		m["pad"] = strings.Repeat("x", size-base-4) // str32 header: 5 bytes
		b := fromMap(t, m)
		if len(b) != size {
			t.Fatalf("padded to %d bytes, want %d", len(b), size)
		}
		return b
	}
	t.Run("exactly the limit decodes", func(t *testing.T) {
		got, err := schemas.Decode[schemas.InboundMessage](padded(t, schemas.MaxPayloadBytes))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got.MessageID != exMessageID {
			t.Errorf("message id %q", got.MessageID)
		}
	})
	t.Run("one byte over the limit is too large", func(t *testing.T) {
		_, err := schemas.Decode[schemas.InboundMessage](padded(t, schemas.MaxPayloadBytes+1))
		wantCode(t, err, schemas.CodePayloadTooLarge)
	})
	t.Run("garbage over the limit is too large, not malformed", func(t *testing.T) {
		_, err := schemas.Decode[schemas.Decision](make([]byte, schemas.MaxPayloadBytes+1))
		wantCode(t, err, schemas.CodePayloadTooLarge)
	})
}

func TestEncodeStampsOnlyTheRecordsOwnVersion(t *testing.T) {
	n := exampleNotice()
	n.V = 0
	b, err := schemas.Encode(n)
	if err != nil {
		t.Fatal(err)
	}
	if n.V != schemas.NoticeVersion {
		t.Errorf("version %d was not stamped to %d", n.V, schemas.NoticeVersion)
	}
	if !bytes.Equal(b, readGolden(t, "turn_notice.v1.msgpack")) {
		t.Errorf("a record built without a version does not encode as the golden file")
	}
	n.V = 7
	if _, err := schemas.Encode(n); err != nil {
		t.Fatal(err)
	}
	if n.V != schemas.NoticeVersion {
		t.Errorf("version 7 was not restamped to %d", schemas.NoticeVersion)
	}

	// A nested TurnContext is authority, not plumbing: its version is the
	// one it was built or decoded with, and a missing one stays missing.
	a := exampleAccepted()
	a.Context.V = 0
	b, err = schemas.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	if a.Context.V != 0 {
		t.Errorf("Encode stamped the nested context to v%d", a.Context.V)
	}
	got, err := schemas.Decode[schemas.AcceptedTurn](b)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, got.Context.CheckFor(got.TurnID), schemas.CodeSchemaVersionUnsupported)
}

// A TurnContext read from storage with a version this build does not know
// must stay unknown when its record is written back (for example by a
// compare-and-set that only changes the status): re-encoding must not
// relabel it as current, or a later Check would accept authority it cannot
// interpret.
func TestReencodeKeepsUnknownContextVersion(t *testing.T) {
	for _, golden := range []string{"accepted_turn.v1.msgpack", "approval_record.v2.msgpack", "batch_record.v1.msgpack"} {
		for _, v := range []int{0, 9} {
			t.Run(fmt.Sprintf("%s with context v%d", golden, v), func(t *testing.T) {
				reencodeKeepsContextVersion(t, golden, v)
			})
		}
	}
}

func reencodeKeepsContextVersion(t *testing.T, golden string, v int) {
	t.Helper()
	m := toMap(t, readGolden(t, golden))
	m["context"].(map[string]any)["v"] = v
	decode := decoderFor(t, golden)
	rec, err := decode(fromMap(t, m))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	again, err := schemas.Encode(rec)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	rec2, err := decode(again)
	if err != nil {
		t.Fatalf("decode again: %v", err)
	}
	ctx := reflect.ValueOf(rec2).Elem().FieldByName("Context").Interface().(*schemas.TurnContext)
	if int(ctx.V) != v {
		t.Errorf("context version became %d after a round trip, want %d", ctx.V, v)
	}
	wantCode(t, ctx.Check(), schemas.CodeSchemaVersionUnsupported)
}

func TestZeroTimeRoundTrips(t *testing.T) {
	a := exampleApproval()
	a.ExpiresAt = time.Time{} // never expires
	b, err := schemas.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := schemas.Decode[schemas.ApprovalRecord](b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ExpiresAt.IsZero() {
		t.Errorf("zero expiry decoded as %v", got.ExpiresAt)
	}
	if !got.RequestedAt.Equal(t1) {
		t.Errorf("requested_at %v, want %v", got.RequestedAt, t1)
	}
}

// allocated is the process's cumulative heap allocation in bytes.
func allocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestBatchRecordWithoutLoopKeysDecodes: a batch record written before
// plan, held_by and superseded_by existed decodes with them false / empty
// (the planner's upgrade story relies on it).
func TestBatchRecordWithoutLoopKeysDecodes(t *testing.T) {
	m := toMap(t, readGolden(t, "batch_record.v2.msgpack"))
	for _, k := range []string{"plan", "held_by", "superseded_by"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("the golden file has no %s to remove", k)
		}
		delete(m, k)
	}
	rec, err := decoderFor(t, "batch_record.v2.msgpack")(fromMap(t, m))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	b := rec.(*schemas.BatchRecord)
	if b.Plan || b.HeldBy != "" || b.SupersededBy != "" {
		t.Fatalf("plan %v held_by %q superseded_by %q, want zero", b.Plan, b.HeldBy, b.SupersededBy)
	}
	ex := exampleBatch()
	ex.Plan, ex.HeldBy, ex.SupersededBy = false, "", ""
	if !reflect.DeepEqual(utc(rec), utc(ex)) {
		t.Fatalf("decoded %+v\nwant %+v", b, ex)
	}
}

// A context sealed by the previous version has no session_key: it still
// decodes, to the example without it, and its session is the legacy one
// (docs/protocol.md §3.1).
func TestGoldenContextWithoutSessionKey(t *testing.T) {
	golden := readGolden(t, "turn_context.v1-unscoped.msgpack")
	tc, err := schemas.Decode[schemas.TurnContext](golden)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := exampleContext()
	want.SessionKey = ""
	if enc, err := schemas.Encode(want); err != nil || !bytes.Equal(enc, golden) {
		t.Fatalf("the example without its session key encodes to other bytes than the previous version's vector (%v)", err)
	}
	if tc.SessionKey != "" || tc.SessionID != want.SessionID || tc.Transport != want.Transport {
		t.Fatalf("decoded %+v, want the example without its session key", tc)
	}
	if got := schemas.SessionKeyOf(tc); got != schemas.LegacySessionKey(exSession) {
		t.Fatalf("SessionKeyOf = %s, want the legacy key %s", got, schemas.LegacySessionKey(exSession))
	}
}

// A context whose session key is not its own transport's and session's
// is refused: a context cannot name another transport's session.
func TestContextWithAnotherSessionKeyIsInvalid(t *testing.T) {
	tc := exampleContext()
	tc.SessionKey = schemas.SessionKey("gateway", exSession)
	err := tc.Check()
	if schemas.CodeOf(err) != schemas.CodeTurnContextInvalid || !strings.Contains(err.Error(), "session_key") {
		t.Fatalf("Check = %v, want TURN_CONTEXT_INVALID naming session_key", err)
	}
}

// A version 1 batch record (its claims in tollgate_claims) decodes only
// through DecodeBatch, marked Legacy, with every field intact, and is
// written back as version 1 without claims; the current version decodes as
// itself; any other version, or a version 1 record carrying claims, is
// rejected, never guessed.
func TestDecodeLegacyBatchRecord(t *testing.T) {
	v1 := readGolden(t, "batch_record.v1.msgpack")
	_, err := schemas.Decode[schemas.BatchRecord](v1)
	wantCode(t, err, schemas.CodeSchemaVersionUnsupported)

	b, err := schemas.DecodeBatch(v1)
	if err != nil || !b.Legacy() {
		t.Fatalf("v1 golden: %+v, %v; want a legacy record", b, err)
	}
	if want := (*schemas.BatchRecord)(exampleBatchV1()); !reflect.DeepEqual(utc(*schemas.AsLegacyBatch(b)), utc(*schemas.AsLegacyBatch(want))) {
		t.Fatalf("v1 golden decodes to\n%#v\nwant\n%#v", b, want)
	}
	again, err := schemas.Encode(b)
	if err != nil || !bytes.Equal(again, v1) {
		t.Fatalf("a legacy record is written back as\n%x (%v)\nwant the v1 bytes\n%x", again, err, v1)
	}
	b.Claims = []*schemas.CallClaim{{Worker: "w", ClaimedAt: t1}, nil}
	_, err = schemas.Encode(b)
	wantCode(t, err, schemas.CodeInvalidInput)

	cur, err := schemas.DecodeBatch(readGolden(t, "batch_record.v2.msgpack"))
	if err != nil || cur.Legacy() || cur.ClaimOf(0) == nil || cur.ClaimOf(0).Worker == "" {
		t.Fatalf("v2 golden: %+v, %v", cur, err)
	}
	for _, v := range []int{0, 3, 65535} {
		m := toMap(t, v1)
		m["v"] = v
		_, err := schemas.DecodeBatch(fromMap(t, m))
		wantCode(t, err, schemas.CodeSchemaVersionUnsupported)
	}
	m := toMap(t, readGolden(t, "batch_record.v2.msgpack"))
	m["v"] = 1
	_, err = schemas.DecodeBatch(fromMap(t, m))
	wantCode(t, err, schemas.CodeInvalidInput)
}
