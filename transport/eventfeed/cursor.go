package eventfeed

import (
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Cursor is a position in the feed: for each stream it follows, the
// sequence of the last message handed out (or where it starts). Index 0 is
// TOLLGATE_EVENTS, index 1+i the turn-log partition TOLLGATE_TURNLOG_<i>.
//
// Every event carries the cursor after it (Event.ID), and a subscriber
// given that cursor (Options.After) gets exactly the events handed out
// after it: each stream is read after its own sequence, so nothing is
// missed and nothing comes twice, whatever order the streams' messages
// were merged in.
type Cursor []uint64

// String is the cursor as an SSE id: its sequences in order, joined by
// dots ("1234.56.0.78.9"). A cursor of one sequence is that number alone.
func (c Cursor) String() string {
	var b strings.Builder
	for i, n := range c {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.FormatUint(n, 10))
	}
	return b.String()
}

// ParseCursor reads a cursor written by String. A bare decimal is read as
// a TOLLGATE_EVENTS sequence alone, an SSE id of an earlier version: the
// subscription reads the turn logs from the time that event was stored
// (Options.After). Anything else (empty tokens, signs, non-digits, a
// number that overflows 64 bits) is an error with code INVALID_INPUT. The
// number of sequences is checked against the streams by Subscribe.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "an empty event id")
	}
	parts := strings.Split(s, ".")
	if len(parts) > 1+maxPartitions {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %.40q has %d positions, more than a feed follows", s, len(parts))
	}
	c := make(Cursor, len(parts))
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %.40q: want dot-separated decimal sequences", s)
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "event id %.40q: sequence %.24q is out of range", s, p)
		}
		c[i] = n
	}
	return c, nil
}
