package topology

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// The turn logs (issue 36, design (b): "the turn's events are the log";
// docs/bench.md, "Plan for the next sessions"). A turn's events are
// appended to one of TurnLogPartitions streams, chosen by the turn id's
// hash, on the subject
//
//	tollgate.turnlog.<partition>.<turn>.<event>
//
// each by compare-and-set against the turn's last event (package
// jetstream/turnlog). Spreading the turns over several streams spreads
// their serial disk flushes: one stream stored 4,365 single writes/s on
// the bench machine, five 6,410 (docs/bench.md).
//
// Ensure provisions the streams with the rest of the topology. Each
// records the number of partitions in its metadata (MetaTurnLogPartitions),
// and every process reads it from there (OpenBuckets), so that all agree
// on a turn's partition whatever their own configuration says; Ensure
// refuses to change it (ErrTurnLogPartitions), since that would move
// turns between streams.
const (
	// StreamTurnLogPrefix + the partition is a turn-log stream's name.
	StreamTurnLogPrefix = "TOLLGATE_TURNLOG_"
	// SubjectTurnLogPrefix + "<partition>." starts every subject of that
	// partition's stream.
	SubjectTurnLogPrefix = "tollgate.turnlog."
	// DefaultTurnLogPartitions is TurnLogPartitions when a Config leaves
	// it 0.
	DefaultTurnLogPartitions = 4
	// MaxTurnLogPartitions bounds TurnLogPartitions.
	MaxTurnLogPartitions = 64
	// MetaTurnLogPartitions is the stream metadata key that holds the
	// number of partitions on every turn-log stream.
	MetaTurnLogPartitions = "tollgate_turnlog_partitions"
)

// ErrTurnLogPartitions is wrapped by Ensure's and OpenBuckets' errors when
// the turn-log streams on the server were provisioned with another number
// of partitions than the configuration asks for, or record none.
var ErrTurnLogPartitions = errors.New("topology: turn-log partitions differ")

// TurnLogPartitionCount is c's number of turn-log streams.
func (c Config) TurnLogPartitionCount() int {
	if c.TurnLogPartitions == 0 {
		return DefaultTurnLogPartitions
	}
	return c.TurnLogPartitions
}

// TurnLogStream is the name of partition i's turn-log stream.
func TurnLogStream(i int) string { return StreamTurnLogPrefix + strconv.Itoa(i) }

// TurnLogPartition is the partition of turn among partitions: FNV-1a of
// the turn id, mod partitions. It never changes for a turn and a number
// of partitions; a deployment that changes its number of partitions
// moves turns between streams (the upgrade path's concern, not this
// function's).
func TurnLogPartition(turn string, partitions int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(turn))
	return int(h.Sum32() % uint32(partitions))
}

// TurnLogSubject is the subject of turn's event in partition i.
func TurnLogSubject(i int, turn, event string) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + "." + turn + "." + event
}

// ParseTurnLogSubject is TurnLogSubject's inverse: the partition, turn
// and event of subject tollgate.turnlog.<i>.<turn>.<event>; ok is false
// for any other subject (another prefix, a partition that is not a
// number as TurnLogSubject writes it, an empty, missing or wildcard turn
// or event, more tokens).
func ParseTurnLogSubject(subject string) (i int, turn, event string, ok bool) {
	rest, ok := strings.CutPrefix(subject, SubjectTurnLogPrefix)
	if !ok {
		return 0, "", "", false
	}
	part, rest, _ := strings.Cut(rest, ".")
	turn, event, _ = strings.Cut(rest, ".")
	i, err := strconv.Atoi(part)
	if err != nil || strconv.Itoa(i) != part || i < 0 || turn == "" || event == "" ||
		strings.Contains(event, ".") || strings.ContainsAny(turn+event, "*>") {
		return 0, "", "", false
	}
	return i, turn, event, true
}

// TurnLogOutcomeFilter is the filter of partition i's outcome events,
// tollgate.turnlog.<i>.*.outcome: each turn's last event, whose record
// carries the turn's outcome (pipeline/store, EventOutcome).
func TurnLogOutcomeFilter(i int) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + ".*." + EventTurnOutcome
}

// EventTurnOutcome is the name of a turn's ending event in its log.
const EventTurnOutcome = "outcome"

// TurnLogAwaitingFilter is the filter of partition i's awaiting events,
// tollgate.turnlog.<i>.*.awaiting: each the move of a turn's batch to
// awaiting, whose record carries the approvals it requested
// (pipeline/store, EventAwaiting).
func TurnLogAwaitingFilter(i int) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + ".*." + EventTurnAwaiting
}

// EventTurnAwaiting is the name of the event that moves a turn's batch
// to awaiting its approvals.
const EventTurnAwaiting = "awaiting"

// TurnLogStartedFilter is the filter of partition i's started events,
// tollgate.turnlog.<i>.*.started: each the move of a turn's batch to
// started, whose record carries the decisions its barrier passed on
// (schemas.BatchRecord.Decided).
func TurnLogStartedFilter(i int) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + ".*." + EventTurnStarted
}

// EventTurnStarted is the name of the event that moves a turn's batch to
// started (its approvals all decided).
const EventTurnStarted = "started"

// TurnLogWildcard is the subject filter of every event of turn in
// partition i: the compare-and-set of an append is against its last
// message.
func TurnLogWildcard(i int, turn string) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + "." + turn + ".>"
}

// TurnLogStreams are c's turn-log streams, one per partition: Tollgate's
// stream limits, history and duplicate window (Streams), and direct gets as the buckets
// have them (DirectGets: a turn's last event is read back at once by
// another stage, so a replicated log is read from its leader).
func (c Config) TurnLogStreams() []jetstream.StreamConfig {
	out := make([]jetstream.StreamConfig, c.TurnLogPartitionCount())
	for i := range out {
		out[i] = c.streamBase(TurnLogStream(i), "Tollgate: turn logs, partition "+strconv.Itoa(i)+": each turn's events, appended by compare-and-set",
			SubjectTurnLogPrefix+strconv.Itoa(i)+".>")
		out[i].AllowDirect = c.DirectGets()
		out[i].Metadata = map[string]string{MetaTurnLogPartitions: strconv.Itoa(c.TurnLogPartitionCount())}
	}
	return out
}

// turnLogDiff is streamDiff (which compares allow_direct: a replicated
// log read from a follower could be stale, DirectGets) for a turn-log
// stream, with its partitions.
func turnLogDiff(have, want jetstream.StreamConfig) []FieldDiff {
	d := diffs(streamDiff(have, want))
	field(&d, "metadata."+MetaTurnLogPartitions, have.Metadata[MetaTurnLogPartitions], want.Metadata[MetaTurnLogPartitions])
	return d
}

// checkPartitions refuses a change of the number of partitions: stream 0
// exists and records another number (or none) than c's.
func (c Config) checkPartitions(ctx context.Context, js jetstream.JetStream) error {
	s, err := js.Stream(ctx, TurnLogStream(0))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("look up stream %s: %w", TurnLogStream(0), err)
	}
	have := s.CachedInfo().Config.Metadata[MetaTurnLogPartitions]
	if want := strconv.Itoa(c.TurnLogPartitionCount()); have != want {
		return fmt.Errorf("%w: the server's turn logs have %q, the configuration %s; a turn's partition is its id's hash modulo their number, so changing it would move turns between streams (not supported)",
			ErrTurnLogPartitions, have, want)
	}
	return nil
}

// OpenTurnLogs binds to the turn-log streams on the server: as many as
// their metadata says (MetaTurnLogPartitions), whatever this process's
// configuration says, so that every process finds a turn on the same
// stream. It fails with jetstream.ErrStreamNotFound if Ensure has not run.
func OpenTurnLogs(ctx context.Context, js jetstream.JetStream) ([]jetstream.Stream, error) {
	s0, err := js.Stream(ctx, TurnLogStream(0))
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", TurnLogStream(0), err)
	}
	p, err := strconv.Atoi(s0.CachedInfo().Config.Metadata[MetaTurnLogPartitions])
	if err != nil || p < 1 || p > MaxTurnLogPartitions {
		return nil, fmt.Errorf("%w: stream %s records %q partitions", ErrTurnLogPartitions, TurnLogStream(0), s0.CachedInfo().Config.Metadata[MetaTurnLogPartitions])
	}
	out := []jetstream.Stream{s0}
	for i := 1; i < p; i++ {
		s, err := js.Stream(ctx, TurnLogStream(i))
		if err != nil {
			return nil, fmt.Errorf("open stream %s: %w", TurnLogStream(i), err)
		}
		out = append(out, s)
	}
	return out, nil
}
