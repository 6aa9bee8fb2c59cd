package schemas_test

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestTurnID(t *testing.T) {
	id := schemas.TurnID("slack", "1710408413.000100")
	if !regexp.MustCompile(`^t-[0-9a-f]{20}$`).MatchString(id) {
		t.Fatalf("TurnID = %q, want t- and 20 hex characters", id)
	}
	if again := schemas.TurnID("slack", "1710408413.000100"); again != id {
		t.Errorf("TurnID is not deterministic: %s then %s", id, again)
	}

	pairs := [][2]string{
		{"slack", "1710408413.000100"},
		{"slack", "1710408413.000101"},
		{"discord", "1710408413.000100"},
		{"a", "bc"},
		{"ab", "c"},
		{"abc", ""},
		{"", "abc"},
		{"slack", ""},
		{"slack", " 1710408413.000100"},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		id := schemas.TurnID(p[0], p[1])
		if prev, ok := seen[id]; ok {
			t.Errorf("TurnID%q == TurnID%q == %s", p, prev, id)
		}
		seen[id] = p
	}
}

func TestCallAndApprovalIDs(t *testing.T) {
	turn := schemas.TurnID("slack", "m1")
	for _, i := range []int{0, 1, 9, 10, 31, 12345} {
		call := schemas.CallID(turn, i)
		approval := schemas.ApprovalID(turn, i)
		if !strings.HasPrefix(call, turn+"-") {
			t.Errorf("CallID(%s, %d) = %s", turn, i, call)
		}
		if !strings.HasPrefix(approval, "a-") || approval == call {
			t.Errorf("ApprovalID(%s, %d) = %s", turn, i, approval)
		}
		if got := schemas.TurnIDOfApproval(approval); got != turn {
			t.Errorf("TurnIDOfApproval(%s) = %q, want %s", approval, got, turn)
		}
	}
	if schemas.ApprovalID(turn, 1) == schemas.ApprovalID(turn, 11) || schemas.CallID(turn, 1) == schemas.CallID(turn, 11) {
		t.Errorf("ids of calls 1 and 11 collide")
	}
	other := schemas.TurnID("slack", "m2")
	if schemas.ApprovalID(turn, 0) == schemas.ApprovalID(other, 0) {
		t.Errorf("approvals of different turns collide")
	}
}

func TestTurnIDOfApprovalRejectsOtherShapes(t *testing.T) {
	for _, id := range []string{
		"",
		"a-",
		"a--1",
		"a-abc",
		"t-7d207e1f030d85151eb8-0",
		"b-7d207e1f030d85151eb8-0",
		"7d207e1f030d85151eb8-0",
	} {
		if got := schemas.TurnIDOfApproval(id); got != "" {
			t.Errorf("TurnIDOfApproval(%q) = %q, want empty", id, got)
		}
	}
}

func TestSessionKey(t *testing.T) {
	const thread = "T024BE7LD/C0123ABC/1710408400.000050"
	a := schemas.SessionKey("slack", thread)
	if !regexp.MustCompile(`^s-[0-9a-f]{32}$`).MatchString(a) {
		t.Fatalf("SessionKey = %q, want s- and 32 hex characters", a)
	}
	tests := []struct {
		name      string
		transport string
		session   string
		same      bool
	}{
		{"the same transport and session are one session", "slack", thread, true},
		{"another session of the transport is another session", "slack", "T024BE7LD/C0123ABC/1710408400.000051", false},
		{"the same session id on another transport is another session", "gateway", thread, false},
		{"the same id split differently between transport and session is another session", "slackT024BE7LD", "/C0123ABC/1710408400.000050", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := schemas.SessionKey(tt.transport, tt.session) == a; got != tt.same {
				t.Errorf("SessionKey(%q, %q) == SessionKey(slack, thread): %v, want %v", tt.transport, tt.session, got, tt.same)
			}
		})
	}
	if a == schemas.LegacySessionKey(thread) {
		t.Errorf("the scoped key is the legacy key")
	}
	if schemas.SessionKey("x", "") == schemas.TurnID("x", "") {
		t.Errorf("session key and turn id share a hash domain")
	}
}

// TestLegacySessionKey pins the previous version's key, which contexts
// sealed before the upgrade still resolve to (their sessions' records are
// stored under it).
func TestLegacySessionKey(t *testing.T) {
	if got, want := schemas.LegacySessionKey("demo"), "s-"+hexSHA256("session\x00demo\x00")[:32]; got != want {
		t.Errorf("LegacySessionKey(demo) = %s, want %s", got, want)
	}
}

func TestSessionKeyOf(t *testing.T) {
	scoped := &schemas.TurnContext{SessionID: "demo", Transport: "cli", SessionKey: schemas.SessionKey("cli", "demo")}
	legacy := &schemas.TurnContext{SessionID: "demo", Transport: "cli"}
	before := schemas.LegacySessionKeyUses()
	if got := schemas.SessionKeyOf(scoped); got != scoped.SessionKey {
		t.Errorf("SessionKeyOf(scoped) = %s, want its sealed key %s", got, scoped.SessionKey)
	}
	if schemas.LegacySessionKeyUses() != before {
		t.Errorf("a scoped context counted as a legacy use")
	}
	if got := schemas.SessionKeyOf(legacy); got != schemas.LegacySessionKey("demo") {
		t.Errorf("SessionKeyOf(context sealed by the previous version) = %s, want the legacy key", got)
	}
	if schemas.LegacySessionKeyUses() != before+1 {
		t.Errorf("the legacy path was not counted")
	}
	if got := schemas.SessionKeyOf(nil); got != "" {
		t.Errorf("SessionKeyOf(nil) = %q", got)
	}
}

func TestPrincipal(t *testing.T) {
	if got := schemas.Principal("slack", "U02ABCDEF"); got != "slack:U02ABCDEF" {
		t.Errorf("Principal = %q", got)
	}
	if schemas.Principal("slack", "U1") == schemas.Principal("discord", "U1") {
		t.Errorf("the same sender id on two transports is one principal")
	}
}

func TestGeneratedIDsAreValidKeys(t *testing.T) {
	sessions := []string{"plain", "T0/C1 thread:42 ü ☃", "a.b.*.>", strings.Repeat("x", 4096), ""}
	turn := schemas.TurnID("slack", "1710408413.000100")
	ids := []string{turn, schemas.CallID(turn, 0), schemas.CallID(turn, 31), schemas.ApprovalID(turn, 0), schemas.ApprovalID(turn, 31)}
	for _, s := range sessions {
		ids = append(ids, schemas.SessionKey("web", s), schemas.LegacySessionKey(s), schemas.TurnID("web", s))
	}
	for _, id := range ids {
		if !schemas.ValidKey(id) {
			t.Errorf("ValidKey(%q) = false for a generated id", id)
		}
	}
}

func TestValidKey(t *testing.T) {
	cases := []struct {
		key  string
		want bool
	}{
		{"a", true},
		{"Az09-_", true},
		{strings.Repeat("k", schemas.MaxIDBytes), true},
		{"", false},
		{strings.Repeat("k", schemas.MaxIDBytes+1), false},
		{"a.b", false}, // a subject separator
		{"a*", false},
		{"a>", false},
		{"a b", false},
		{"slack:U1", false},
		{"a/b", false},
		{"a=b", false},
		{"ü", false},
		{"a\x00", false},
	}
	for _, tc := range cases {
		if got := schemas.ValidKey(tc.key); got != tc.want {
			t.Errorf("ValidKey(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}

func TestTurnIDOfCall(t *testing.T) {
	turn := schemas.TurnID("cli", "m1")
	followUp := schemas.FollowUpTurnID(schemas.CallID(turn, 3))
	cases := []struct {
		name, callID, want string
	}{
		{"call 0", schemas.CallID(turn, 0), turn},
		{"call 31", schemas.CallID(turn, 31), turn},
		{"a call of follow-up work", schemas.CallID(followUp, 0), followUp},
		{"a turn id whose hash starts with f", "t-f0e1d2c3b4a596877869-2", "t-f0e1d2c3b4a596877869"},
		{"empty", "", ""},
		{"no index", turn, ""},
		{"an empty index", turn + "-", ""},
		{"a follow-up id, not a call id", followUp, ""},
		{"no turn", "-0", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := schemas.TurnIDOfCall(tc.callID); got != tc.want {
				t.Errorf("TurnIDOfCall(%q) = %q, want %q", tc.callID, got, tc.want)
			}
		})
	}
}

func hexSHA256(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// CheckTurnKey is ValidKey as the INVALID_INPUT error a stage dead-letters.
func TestCheckTurnKey(t *testing.T) {
	if err := schemas.CheckTurnKey("t-0123456789abcdef0123"); err != nil {
		t.Fatalf("a turn id: %v", err)
	}
	for _, id := range []string{"", "t.1", "t 1", "t*", strings.Repeat("t", schemas.MaxIDBytes+1)} {
		if err := schemas.CheckTurnKey(id); schemas.CodeOf(err) != schemas.CodeInvalidInput {
			t.Errorf("CheckTurnKey(%q) = %v, want INVALID_INPUT", id, err)
		}
	}
}

// TestAnIDIsOneAllocation: ids are made and checked on every record a
// stage decodes (a context's session key is checked against its session
// on each), so making one allocates the id alone.
func TestAnIDIsOneAllocation(t *testing.T) {
	for name, id := range map[string]func() string{
		"session key": func() string { return schemas.SessionKey("cli", "demo") },
		"turn id":     func() string { return schemas.TurnID("cli", "m-1") },
		"grant id":    func() string { return schemas.GrantID("a-1", "d-1") },
	} {
		if n := testing.AllocsPerRun(100, func() { _ = id() }); n > 1 {
			t.Errorf("%s: %v allocations, want 1", name, n)
		}
	}
}

// TestIDsAreTheProtocolsExamples: ids are stored (keys, subjects, message
// ids), so their derivation never changes: docs/protocol.md §3's examples.
func TestIDsAreTheProtocolsExamples(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"a Slack turn id", schemas.TurnID("slack", "1710408413.000100"), "t-7d207e1f030d85151eb8"},
		{"a CLI turn id", schemas.TurnID("cli", "m-1"), "t-2cc6f4bcdd266eeac12f"},
		{"a session key", schemas.SessionKey("cli", "demo"), "s-514f89d6fdffa8de164a56eef51b9386"},
		{"a legacy session key", schemas.LegacySessionKey("demo"), "s-7c99e7adf9bc59cb2a2c2794a2c6d40d"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}
