package eventfeed

import (
	"errors"
	"fmt"
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

// A turn log's awaiting event may keep several requests, each handed out
// as an event of its own, all from that one message: the position after
// one that is not the last (more follow) is a split position. It names
// the awaiting event's sequence S and how many of its requests k were
// handed out, as k<<splitShift | S in that partition's place of the
// cursor (a stream sequence never reaches 2^splitShift): a subscriber
// that starts there reads the partition from S and passes over the first
// k requests of the message at S, so that each event comes once.
const splitShift = 48

// splitAt is the split position after the k-th request of the awaiting
// event at seq.
func splitAt(seq uint64, k int) uint64 { return uint64(k)<<splitShift | seq }

// split is a subscription's split position, if its start was one: of
// source src's message seq, the first k requests were had.
type split struct {
	src int
	seq uint64
	k   int
}

// covers reports whether ev is one of the requests s says were had.
func (s split) covers(ev Event) bool {
	return s.k > 0 && ev.Source == s.src && ev.Seq == s.seq && ev.part > 0 && ev.part <= s.k
}

// splitOf turns the split position in from, if any, into the position
// before its message (from is changed) and the split it names; more than
// one is an error, as is one in the events stream's place.
func splitOf(from Cursor) (split, error) {
	var sp split
	for i, v := range from {
		k := v >> splitShift
		if k == 0 {
			continue
		}
		seq := v & (1<<splitShift - 1)
		switch {
		case i == 0:
			return split{}, errors.New("the events stream's place is a sequence")
		case sp.k > 0:
			return split{}, errors.New("two positions inside a message")
		case seq == 0 || k > schemas.MaxCalls:
			return split{}, fmt.Errorf("position %d is not one the feed hands out", v)
		}
		sp = split{src: i, seq: seq, k: int(k)}
		from[i] = seq - 1
	}
	return sp, nil
}
