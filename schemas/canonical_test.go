package schemas_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
)

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func canonical(t *testing.T, raw string) (string, string) {
	t.Helper()
	c, d, err := schemas.CanonicalArgs(raw)
	if err != nil {
		t.Fatalf("CanonicalArgs(%q): %v", raw, err)
	}
	if !digestRE.MatchString(d) {
		t.Fatalf("digest %q is not sha256:<64 hex>", d)
	}
	if d != schemas.ArgsDigest(c) {
		t.Fatalf("digest %s is not ArgsDigest of the canonical form %s", d, c)
	}
	return c, d
}

func TestCanonicalArgsSameCall(t *testing.T) {
	cases := []struct {
		name string
		a, b string
	}{
		{"key order", `{"to":"cfo@example.com","body":"hi"}`, `{"body":"hi","to":"cfo@example.com"}`},
		{"white space", `{"a":1,"b":[1,2]}`, " {\n\t\"a\" : 1 ,\r\n \"b\" : [ 1 , 2 ] }\n"},
		{"nested key order", `{"o":{"y":1,"x":{"q":2,"p":3}}}`, `{"o":{"x":{"p":3,"q":2},"y":1}}`},
		{"empty string is an empty object", ``, `{}`},
		{"escaped and literal characters", `{"name":"caf\u00e9 \u003cb\u003e"}`, `{"name":"café <b>"}`},
		{"escaped key", `{"\u0061":1}`, `{"a":1}`},
		{"duplicate keys collapse to the last, as in the form that runs", `{"a":1,"a":2}`, `{"a":2}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ca, da := canonical(t, tc.a)
			cb, db := canonical(t, tc.b)
			if ca != cb || da != db {
				t.Errorf("%q -> %s %s\n%q -> %s %s", tc.a, ca, da, tc.b, cb, db)
			}
		})
	}
}

func TestCanonicalArgsForm(t *testing.T) {
	cases := []struct{ raw, want string }{
		{`{ "b" : 2 , "a" : [ 3 , 1 ] }`, `{"a":[3,1],"b":2}`},
		{`{"html":"<a href='x'>&</a>"}`, `{"html":"<a href='x'>&</a>"}`},
		{`{"n":1.50,"big":123456789012345678901234567890,"e":1E3}`, `{"big":123456789012345678901234567890,"e":1E3,"n":1.50}`},
		{`{"s":"tab\there"}`, `{"s":"tab\there"}`},
		{``, `{}`},
	}
	for _, tc := range cases {
		got, _ := canonical(t, tc.raw)
		if got != tc.want {
			t.Errorf("CanonicalArgs(%q) = %s, want %s", tc.raw, got, tc.want)
		}
		again, _ := canonical(t, got)
		if again != got {
			t.Errorf("canonical form is not a fixed point: %s -> %s", got, again)
		}
	}
}

func TestCanonicalArgsDifferentCall(t *testing.T) {
	cases := []struct {
		name string
		a, b string
	}{
		{"different value", `{"to":"cfo@example.com"}`, `{"to":"attacker@example.com"}`},
		{"different key", `{"to":"x"}`, `{"cc":"x"}`},
		{"extra key", `{"to":"x"}`, `{"to":"x","bcc":"y"}`},
		{"array order", `{"to":["a","b"]}`, `{"to":["b","a"]}`},
		{"string and number", `{"n":1}`, `{"n":"1"}`},
		{"numbers are kept as written", `{"n":1}`, `{"n":1.0}`},
		{"null and absent", `{"a":null}`, `{}`},
		{"nested value", `{"o":{"a":true}}`, `{"o":{"a":false}}`},
		{"letter case", `{"path":"/etc/passwd"}`, `{"path":"/ETC/passwd"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, da := canonical(t, tc.a)
			_, db := canonical(t, tc.b)
			if da == db {
				t.Errorf("%q and %q have the same digest %s", tc.a, tc.b, da)
			}
		})
	}
}

func TestCanonicalArgsRejects(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want schemas.Code
	}{
		{"null", `null`, schemas.CodeArgsInvalidJSON},
		{"an array", `[1,2]`, schemas.CodeArgsInvalidJSON},
		{"a string", `"x"`, schemas.CodeArgsInvalidJSON},
		{"a number", `42`, schemas.CodeArgsInvalidJSON},
		{"a boolean", `true`, schemas.CodeArgsInvalidJSON},
		{"only white space", "  \n", schemas.CodeArgsInvalidJSON},
		{"a second object after the first", `{"a":1}{"b":2}`, schemas.CodeArgsInvalidJSON},
		{"trailing garbage", `{"a":1} x`, schemas.CodeArgsInvalidJSON},
		{"trailing comma", `{"a":1,}`, schemas.CodeArgsInvalidJSON},
		{"unterminated object", `{"a":1`, schemas.CodeArgsInvalidJSON},
		{"single quotes", `{'a':1}`, schemas.CodeArgsInvalidJSON},
		{"bare key", `{a:1}`, schemas.CodeArgsInvalidJSON},
		{"comment", `{"a":1 /* x */}`, schemas.CodeArgsInvalidJSON},
		{"NaN", `{"a":NaN}`, schemas.CodeArgsInvalidJSON},
		{"invalid UTF-8 in a string", "{\"a\":\"\xff\"}", schemas.CodeArgsInvalidJSON},
		// U+2028 is 3 bytes in the input and 6 (\u2028) once canonical.
		{"escaping that grows past the args limit", `{"a":"` + strings.Repeat("\u2028", 5000) + `"}`, schemas.CodePayloadTooLarge},
		{"deep nesting over the args limit", strings.Repeat(`{"a":`, 20000) + "1" + strings.Repeat("}", 20000), schemas.CodePayloadTooLarge},
		{"over the args limit", `{"a":"` + strings.Repeat("x", schemas.MaxArgsBytes) + `"}`, schemas.CodePayloadTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, d, err := schemas.CanonicalArgs(tc.raw)
			wantCode(t, err, tc.want)
			if c != "" || d != "" {
				t.Errorf("got canonical %q digest %q with the error", c, d)
			}
		})
	}
	t.Run("the deepest nesting that fits the limit is canonicalised", func(t *testing.T) {
		n := (schemas.MaxArgsBytes - len(`{"a":}`)) / 2
		raw := `{"a":` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n) + `}`
		c, _ := canonical(t, raw)
		if c != raw {
			t.Errorf("canonical form differs from the already canonical input")
		}
	})
}

func TestArgsDigest(t *testing.T) {
	// sha256("{}")
	if got, want := schemas.ArgsDigest("{}"), "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"; got != want {
		t.Errorf("ArgsDigest({}) = %s, want %s", got, want)
	}
}

func TestContextDigest(t *testing.T) {
	base := schemas.ContextDigest(exampleContext())
	if base == "" || base != schemas.ContextDigest(exampleContext()) {
		t.Fatalf("digest of equal contexts: %q vs %q", base, schemas.ContextDigest(exampleContext()))
	}
	if d := schemas.ContextDigest(nil); d != "" {
		t.Errorf("ContextDigest(nil) = %q, want empty", d)
	}

	changes := []struct {
		name   string
		mutate func(*schemas.TurnContext)
	}{
		{"audience", func(c *schemas.TurnContext) { c.Audience = schemas.AudiencePublic }},
		{"principal", func(c *schemas.TurnContext) { c.Requester.Principal = "slack:U0OTHER" }},
		{"sender id", func(c *schemas.TurnContext) { c.Requester.SenderID = "U0OTHER" }},
		{"requester kind", func(c *schemas.TurnContext) { c.Requester.Kind = schemas.SenderBot }},
		{"verified", func(c *schemas.TurnContext) { c.Requester.Verified = false }},
		{"trust boundary", func(c *schemas.TurnContext) { c.TrustBoundary = "other-corp" }},
		{"interactive", func(c *schemas.TurnContext) { c.Interactive = false }},
		{"channel", func(c *schemas.TurnContext) { c.Channel.ID = "C0OTHER" }},
		{"channel kind", func(c *schemas.TurnContext) { c.Channel.Kind = schemas.ChannelPublic }},
		{"thread", func(c *schemas.TurnContext) { c.Channel.Thread = "" }},
		{"transport", func(c *schemas.TurnContext) { c.Transport = "discord" }},
		{"turn", func(c *schemas.TurnContext) { c.TurnID = "t-00000000000000000000" }},
		{"session", func(c *schemas.TurnContext) { c.SessionID = "other" }},
		{"version", func(c *schemas.TurnContext) { c.V = 2 }},
		{"provenance", func(c *schemas.TurnContext) { c.Provenance.StreamSeq++ }},
		{"creation time", func(c *schemas.TurnContext) { c.CreatedAt = c.CreatedAt.Add(1) }},
	}
	for _, tc := range changes {
		t.Run("changing the "+tc.name+" changes the digest", func(t *testing.T) {
			c := exampleContext()
			tc.mutate(c)
			if d := schemas.ContextDigest(c); d == base {
				t.Errorf("digest unchanged: %s", d)
			}
		})
	}

	t.Run("the digest survives persistence", func(t *testing.T) {
		b, err := schemas.Encode(exampleApproval())
		if err != nil {
			t.Fatal(err)
		}
		a, err := schemas.Decode[schemas.ApprovalRecord](b)
		if err != nil {
			t.Fatal(err)
		}
		if d := schemas.ContextDigest(a.Context); d != base {
			t.Errorf("persisted context digest %s, want %s", d, base)
		}
	})
	t.Run("the time zone does not change the digest", func(t *testing.T) {
		c := exampleContext()
		loc := time.FixedZone("UTC+5:30", 5*3600+1800)
		c.CreatedAt = c.CreatedAt.In(loc)
		c.Provenance.ReceivedAt = c.Provenance.ReceivedAt.In(loc)
		if d := schemas.ContextDigest(c); d != base {
			t.Errorf("digest %s in another zone, want %s", d, base)
		}
	})
}

// WriteSealed (the seal's pooled path, behind SealedBytes too) writes the
// plain msgpack encoding of the context without its seal, for a full
// context and for one whose optional fields are empty, also with a reused
// encoder, and leaves the caller's seal alone.
func TestWriteSealedWritesSealedBytes(t *testing.T) {
	full := exampleContext()
	bare := exampleContext()
	bare.Channel.Thread, bare.TrustBoundary, bare.LegacyRestored, bare.Seal = "", "", false, nil
	for name, tc := range map[string]*schemas.TurnContext{"full context": full, "context without optional fields": bare} {
		t.Run(name, func(t *testing.T) {
			unsealed := *tc
			unsealed.Seal = nil
			want, err := msgpack.Marshal(&unsealed)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := schemas.SealedBytes(tc); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("SealedBytes = %x %v, want %x", got, err, want)
			}
			var got bytes.Buffer
			for range 2 { // the second time with a reused encoder
				got.Reset()
				if err := schemas.WriteSealed(&got, tc); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Bytes(), want) {
					t.Fatalf("WriteSealed wrote %x, want %x", got.Bytes(), want)
				}
			}
			if tc == full && tc.Seal == nil {
				t.Fatal("WriteSealed cleared the caller's seal")
			}
		})
	}
}
