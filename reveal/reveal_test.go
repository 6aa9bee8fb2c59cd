package reveal

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHostileExamplesAreShownEscaped(t *testing.T) {
	for _, ex := range HostileExamples {
		got, flagged := String(ex.Text)
		if !flagged || got != ex.Shown {
			t.Errorf("%s: String(%q) = %q, %v; want %q, true", ex.Name, ex.Text, got, flagged, ex.Shown)
		}
		if back := unescape(t, got); back != ex.Text {
			t.Errorf("%s: %q does not read back as %q: %q", ex.Name, got, ex.Text, back)
		}
	}
}

func TestPlainTextIsUnchanged(t *testing.T) {
	for _, s := range []string{"", "cli:alice", `C:\temp\u202E`, "héllo wörld 日本語 😀", "line\nnext\ttab", `{"a":"\u001b"}`} {
		if got, flagged := String(s); flagged || got != s {
			t.Errorf("String(%q) = %q, %v; want it unchanged", s, got, flagged)
		}
	}
}

func TestJSONKeepsTheValue(t *testing.T) {
	for _, ex := range HostileExamples {
		raw, _ := json.Marshal(map[string]string{ex.Text: ex.Text})
		got, flagged := JSON(string(raw))
		if !flagged {
			t.Errorf("%s: JSON(%s) not flagged", ex.Name, raw)
		}
		if Contains(got) {
			t.Errorf("%s: JSON(%s) = %q still holds a flagged rune", ex.Name, raw, got)
		}
		var v map[string]string
		if err := json.Unmarshal([]byte(got), &v); err != nil || v[ex.Text] != ex.Text {
			t.Errorf("%s: JSON(%s) = %s decodes to %q, %v", ex.Name, raw, got, v, err)
		}
	}
	// An escape the text already held is flagged, and kept.
	for _, s := range []string{`{"a":"\u202e"}`, `{"a":"x\r"}`, `{"a":"\udb40\udc41"}`} {
		if got, flagged := JSON(s); !flagged || got != s {
			t.Errorf("JSON(%s) = %s, %v; want it unchanged and flagged", s, got, flagged)
		}
	}
	for _, s := range []string{`{"a":"\\u202e"}`, `{"a":"x\n\t\"\\"}`, `{"é":"日本"}`} {
		if got, flagged := JSON(s); flagged || got != s {
			t.Errorf("JSON(%s) = %s, %v; want it unchanged, not flagged", s, got, flagged)
		}
	}
}

func TestControls(t *testing.T) {
	in := "ok\x1b]0;pwned\x07\x1b[2J\r\u009b31m\nnext\ttab \u202E stays"
	want := `ok\u001B]0;pwned\u0007\u001B[2J\u000D\u009B31m` + "\nnext\ttab \u202E stays"
	if got := Controls(in); got != want {
		t.Errorf("Controls = %q, want %q", got, want)
	}
	if got := Controls("plain\ntext"); got != "plain\ntext" {
		t.Errorf("Controls changed plain text: %q", got)
	}
}

// unescape reverses String for a flagged result.
func unescape(t *testing.T, s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			t.Fatalf("%q: lone backslash at the end", s)
		}
		width := 0
		switch s[i+1] {
		case '\\':
			b.WriteByte('\\')
			i++
			continue
		case 'x':
			width = 2
		case 'u':
			width = 4
		case 'U':
			width = 8
		default:
			t.Fatalf("%q: unknown escape %q", s, s[i:i+2])
		}
		if i+2+width > len(s) {
			t.Fatalf("%q: short escape", s)
		}
		v, err := strconv.ParseUint(s[i+2:i+2+width], 16, 32)
		if err != nil {
			t.Fatalf("%q: bad escape: %v", s, err)
		}
		if width == 2 {
			b.WriteByte(byte(v))
		} else {
			b.WriteRune(rune(v))
		}
		i += 1 + width
	}
	return b.String()
}

func FuzzString(f *testing.F) {
	for _, ex := range HostileExamples {
		f.Add(ex.Text)
	}
	f.Add("plain text")
	f.Add(`back\slash`)
	f.Add("\xff\xfe")
	f.Fuzz(func(t *testing.T, s string) {
		got, flagged := String(s)
		if flagged != Contains(s) {
			t.Fatalf("String(%q): flagged %v, Contains %v", s, flagged, Contains(s))
		}
		if Contains(got) || !utf8.ValidString(got) {
			t.Fatalf("String(%q) = %q holds a flagged rune", s, got)
		}
		if !flagged {
			if got != s {
				t.Fatalf("String(%q) = %q: plain text changed", s, got)
			}
			return
		}
		if back := unescape(t, got); back != s {
			t.Fatalf("String(%q) = %q reads back as %q", s, got, back)
		}
		if c := Controls(s); strings.ContainsFunc(c, isControl) {
			t.Fatalf("Controls(%q) = %q holds a control", s, c)
		}
	})
}

func FuzzJSON(f *testing.F) {
	for _, ex := range HostileExamples {
		raw, _ := json.Marshal(ex.Text)
		f.Add(string(raw))
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := json.Marshal(map[string]string{s: s})
		if err != nil {
			return
		}
		got, _ := JSON(string(raw))
		if Contains(got) {
			t.Fatalf("JSON(%s) = %q holds a flagged rune", raw, got)
		}
		var a, b any
		_ = json.Unmarshal(raw, &a)
		if err := json.Unmarshal([]byte(got), &b); err != nil {
			t.Fatalf("JSON(%s) = %s is not JSON: %v", raw, got, err)
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Fatalf("JSON(%s) = %s decodes to another value", raw, got)
		}
	})
}
