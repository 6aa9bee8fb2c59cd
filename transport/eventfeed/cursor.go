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
// TOLLGATE_EVENTS, index 1+i the turn-log partition TOLLGATE_TURNLOG_<i>,
// and the last, 1+P for P partitions, KV_tollgate_approvals: the approvals
// bucket's stream, whose decisions the feed hands out.
//
// Every event carries the cursor after it (Event.ID), and a subscriber
// given that cursor (Options.After) gets exactly the events handed out
// after it: each stream is read after its own sequence, so nothing is
// missed and nothing comes twice, whatever order the streams' messages
// were merged in.
//
// The approvals' place is the last so that an earlier version's cursor
// keeps its places and their meaning: one of 1+P sequences
// (TOLLGATE_EVENTS and the turn logs, as the version before this one
// wrote them) is told apart by its length (P is fixed when the streams
// are first provisioned), and still resumes, as one of a TOLLGATE_EVENTS
// sequence alone (an id of the version before that) does. Such a cursor
// names no place in the bucket: the decisions it had were the published
// approval.decided events in TOLLGATE_EVENTS up to its sequence there, E,
// and the approver stores a decision in the bucket before it publishes
// the copy, so each of them was stored in the bucket no later than E was.
// Subscribe takes the bucket's place to be its position at the time E was
// stored (the sequence before the first revision stored after that time;
// the bucket's last when there is none), and makes that the
// subscription's origin (package doc): a decision stored after it comes
// from the bucket, its copy passed over; one stored at or before it whose
// copy comes after E (E fell between the storing and the publishing)
// comes from the copy, as before; none comes twice. (The bucket's last
// sequence at the subscription would be as sound while every decision is
// published; once the approver publishes only its answers to repeated
// decisions, a decision stored between E and the resume would be lost.)
// When E is 0 (it had none) or no longer stored (every decision it had is
// older than the streams keep), the bucket is read from its start. The
// times compared are two streams' (on a cluster, maybe two servers'
// clocks): should the bucket's run ahead of the events stream's by d, a
// decision published within d before E may come again.
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

// ParseCursor reads a cursor written by String (of this version or an
// earlier one). A bare decimal is read as a TOLLGATE_EVENTS sequence
// alone, an SSE id of an earlier version: the subscription reads the turn
// logs and the approvals bucket from the time that event was stored
// (Options.After). Anything else (empty tokens, signs, non-digits, a
// number that overflows 64 bits) is an error with code INVALID_INPUT. The
// number of sequences is checked against the streams by Subscribe.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "an empty event id")
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2+maxPartitions {
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
// one is an error, as is one in the events stream's place or the
// approvals bucket's (the last: a revision is one event at most).
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
		case i == len(from)-1:
			return split{}, errors.New("the approvals' place is a sequence")
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

// form is which version's cursor a subscription starts after.
type form int

const (
	formFull form = iota // this version's: every stream the feed follows
	formOld              // the version before's: TOLLGATE_EVENTS and the turn logs, no approvals
	formBare             // an earlier one's: a TOLLGATE_EVENTS sequence alone
)

// placeCursor reads c, a subscription's start, for a feed of n streams
// (TOLLGATE_EVENTS, n-2 turn logs, the approvals bucket): the position
// before the next message to read of each (n sequences; of a cursor of an
// earlier version, 0 in the places it does not name, which Subscribe
// fills in), the split position it names (splitOf) and its form. A
// cursor of another length than n, n-1 or 1 is an error.
func placeCursor(c Cursor, n int) (Cursor, split, form, error) {
	from, f := make(Cursor, n), formFull
	switch len(c) {
	case n:
	case n - 1:
		f = formOld
	case 1:
		f = formBare
	default:
		return nil, split{}, 0, fmt.Errorf("it names %d positions, want %d (or %d, an earlier version's without the approvals; or one, an events stream sequence)", len(c), n, n-1)
	}
	copy(from, c)
	sp, err := splitOf(from)
	if err != nil {
		return nil, split{}, 0, err
	}
	return from, sp, f, nil
}
