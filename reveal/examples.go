package reveal

import (
	"encoding/json"
	"strings"
)

// Example is one hostile text and how String shows it.
type Example struct {
	Name  string
	Text  string // as the attacker wrote it
	Shown string // String(Text)
}

// HostileExamples is the table of hostile texts that every surface's test
// feeds through that surface: each must be shown as Shown (String) or as
// its JSON escape (JSON), never raw, with Warning.
var HostileExamples = []Example{
	{"right-to-left override in a path", "x/invoice\u202Etxt.sh", `x/invoice\u202Etxt.sh`},
	{"zero-width space in a key", "comm\u200Band", `comm\u200Band`},
	{"zero-width space in a host", "prod\u200B-db", `prod\u200B-db`},
	{"zero-width space in a principal", "al\u200Bice", `al\u200Bice`},
	{"bidi isolate and pop", "a\u2066b\u2069c", `a\u2066b\u2069c`},
	{"left-to-right and arabic marks", "\u200Ex\u200F\u061C", `\u200Ex\u200F\u061C`},
	{"byte order mark and word joiner", "\uFEFFrm\u2060", `\uFEFFrm\u2060`},
	{"tag characters", "ok\U000E0041\U000E007F", `ok\U000E0041\U000E007F`},
	{"variation selector", "a\uFE0Fb", `a\uFE0Fb`},
	{"hangul filler", "x\u3164y", `x\u3164y`},
	{"no-break space", "rm\u00A0-rf", `rm\u00A0-rf`},
	{"line separator", "a\u2028b", `a\u2028b`},
	{"escape sequence", "\x1b[2Jhi", `\u001B[2Jhi`},
	{"private use", "\uE000", `\uE000`},
	{"backslash next to a flagged rune", `C:\u202E` + "\u202E", `C:\\u202E\u202E`},
}

// InJSON is how JSON shows e.Text inside a JSON string (without the
// quotes), as a call's canonical arguments hold it.
func (e Example) InJSON() string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(e.Text)
	s, _ := JSON(strings.TrimSuffix(b.String(), "\n"))
	return s[1 : len(s)-1]
}

// HostileArgs is the arguments of a write_file call (path and content)
// that hold every example's text, for a surface's test to show.
func HostileArgs() string {
	texts := make([]string, len(HostileExamples))
	for i, e := range HostileExamples {
		texts[i] = e.Text
	}
	b, _ := json.Marshal(map[string]string{"path": strings.Join(texts, "/"), "content": strings.Join(texts, "\n")})
	return string(b)
}
