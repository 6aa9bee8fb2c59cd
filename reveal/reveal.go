// Package reveal is Tollgate's one rule for showing a call to a person: a
// character that a person cannot see, or that changes how the text around
// it is laid out, is shown as a visible escape, and the surface says that
// the call contains one. Every surface that shows a call to a decider (the
// web inbox, the Slack and Discord prompts, tollgate pending, show and
// outcome, the gateway API's approval view) renders through this package,
// so that what the decider reads is what runs.
//
// # Flagged characters
//
// Flagged reports the characters the rule escapes: control characters
// (Unicode category Cc: C0, DEL and C1) other than line feed and tab; format
// characters (Cf: the bidirectional controls U+200E, U+200F, U+061C,
// U+202A to U+202E and U+2066 to U+2069, the zero-width characters U+200B
// to U+200D, U+2060 to U+2064 and U+FEFF, the soft hyphen, the tag
// characters U+E0000 to U+E007F, ...); the line and paragraph separators
// U+2028 and U+2029; every space other than U+0020 (U+00A0, U+2000 to
// U+200A, U+3000, ...); variation selectors; the other default-ignorable
// characters (U+034F, the Hangul fillers U+115F, U+1160, U+3164, U+FFA0,
// ...) and U+2800; private-use, surrogate and unassigned code points (as of
// the Unicode version of the Go release that built Tollgate); and bytes
// that are not valid UTF-8.
//
// # Escapes
//
// A flagged rune r is written \uXXXX (four upper-case hex digits) when r
// is at most U+FFFF, else \UXXXXXXXX (eight); a byte that is not valid
// UTF-8 is written \xXX.
//
// String is for plain text (a principal, a name, a summary). Text with no
// flagged character is returned unchanged, backslashes included. Text with
// one is returned with every flagged character escaped and, so that an
// escape cannot be forged by text that spells one, every backslash doubled:
// once a surface says "contains invisible characters", \u202E is the
// escape of U+202E and \\u202E is the six characters the text held.
//
// JSON is for JSON text (a call's arguments). A flagged character is
// written as a JSON escape (\uXXXX, a surrogate pair above U+FFFF) and
// backslashes are left alone: the result is JSON that decodes to exactly
// the same value, and an escape the text already held (\u202e, \r) is
// flagged as well when it stands for a flagged character.
//
// Controls is the narrower rule for free text written to a terminal (tool
// output, a model's reply): it escapes only control characters (Cc) other
// than line feed and tab, so that no escape sequence reaches the terminal.
package reveal

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Warning is the line a surface shows with a call that contains a flagged
// character.
const Warning = "Contains invisible or direction-changing characters: they are shown escaped (\\u202E)."

// Flagged reports whether r is shown escaped (see the package comment).
func Flagged(r rune) bool {
	switch {
	case r == '\n' || r == '\t' || r == ' ':
		return false
	case r < 0x20 || r == 0x7f:
		return true
	case r < 0x7f:
		return false // printable ASCII: the common case
	case r == utf8.RuneError, r > unicode.MaxRune, r == 0x2800:
		return true
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zs, unicode.Zl, unicode.Zp, unicode.Co, unicode.Cs,
		unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point) ||
		!unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) // unassigned
}

// Contains reports whether s holds a flagged character or a byte that is
// not valid UTF-8.
func Contains(s string) bool {
	return strings.ContainsFunc(s, Flagged) // a byte that is not UTF-8 is U+FFFD, flagged
}

// String is s as a person is shown it, and whether it contains a flagged
// character (then the surface shows Warning). See the package comment.
func String(s string) (shown string, flagged bool) {
	if !Contains(s) {
		return s, false
	}
	return escape(s, Flagged, true), true
}

// Must is String without the flag, for a field shown next to one whose
// flag the surface already shows.
func Must(s string) string {
	v, _ := String(s)
	return v
}

// escape is s with each rune that esc reports written \uXXXX or
// \UXXXXXXXX, each byte that is not valid UTF-8 written \xXX and, when
// doubleBackslash, each backslash doubled.
func escape(s string, esc func(rune) bool, doubleBackslash bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02X`, s[i])
		case r == '\\' && doubleBackslash:
			b.WriteString(`\\`)
		case esc(r):
			if r <= 0xFFFF {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				fmt.Fprintf(&b, `\U%08X`, r)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// JSON is the JSON text s as a person is shown it, and whether a string in
// it contains a flagged character (written raw or as an escape). The
// result decodes to the same value as s. See the package comment.
func JSON(s string) (shown string, flagged bool) {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02X`, s[i])
			flagged = true
		case r == '\\' && i+1 < len(s):
			// An escape the text already holds: kept as it is, flagged if
			// it stands for a flagged character.
			n = 2
			switch s[i+1] {
			case 'b', 'f', 'r':
				flagged = true
			case 'u':
				if c, ok := hex4(s, i+2); ok {
					n = 6
					if utf16Surrogate(c) {
						if lo, ok := hex4(s, i+8); ok && s[i+6] == '\\' && s[i+7] == 'u' {
							n = 12
							c = utf16Combine(c, lo)
						}
					}
					flagged = flagged || Flagged(c)
				}
			}
			b.WriteString(s[i : i+n])
		case Flagged(r):
			flagged = true
			if r > 0xFFFF {
				hi, lo := utf16Split(r)
				fmt.Fprintf(&b, `\u%04X\u%04X`, hi, lo)
			} else {
				fmt.Fprintf(&b, `\u%04X`, r)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String(), flagged
}

func hex4(s string, at int) (rune, bool) {
	if at+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[at:at+4], 16, 32)
	return rune(v), err == nil
}

func utf16Surrogate(r rune) bool { return r >= 0xD800 && r < 0xDC00 }

func utf16Combine(hi, lo rune) rune {
	if lo < 0xDC00 || lo > 0xDFFF {
		return utf8.RuneError
	}
	return (hi-0xD800)<<10 | (lo - 0xDC00) + 0x10000
}

func utf16Split(r rune) (hi, lo rune) {
	r -= 0x10000
	return 0xD800 + r>>10&0x3FF, 0xDC00 + r&0x3FF
}

// Controls is s with every control character (Cc) other than line feed
// and tab escaped, for free text written to a terminal (tool output, a
// model's reply): no escape sequence (clear screen, window title, hidden
// text) reaches the terminal. Bytes that are not valid UTF-8 are escaped
// too. Backslashes are left alone.
func Controls(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, isControl) {
		return s
	}
	return escape(s, isControl, false)
}

func isControl(r rune) bool { return unicode.Is(unicode.Cc, r) && r != '\n' && r != '\t' }
