package chat

import "strings"

// zwsp is the zero-width space CodeBody puts between backticks. A call's
// own zero-width spaces never reach a prompt raw (reveal shows them as
// \u200B), so every one a prompt holds is this one.
const zwsp = "\u200b"

// CodeBody makes s safe inside a ``` code block of Slack mrkdwn or Discord
// markdown, neither of which supports a longer fence: no two backticks of
// the result are adjacent (a zero-width space goes between them), and it
// neither starts nor ends with one, so no run of s can close the block,
// whatever its length. The text reads the same.
func CodeBody(s string) string {
	if !strings.Contains(s, "`") {
		return s
	}
	var b strings.Builder
	if strings.HasPrefix(s, "`") {
		b.WriteString(zwsp)
	}
	for i := 0; i < len(s); i++ {
		b.WriteByte(s[i])
		if s[i] == '`' && (i+1 == len(s) || s[i+1] == '`') {
			b.WriteString(zwsp)
		}
	}
	return b.String()
}
