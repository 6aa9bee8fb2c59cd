package topology

import (
	"hash/fnv"
	"strconv"

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
// The streams are defined here, with the rest of the topology, and are
// not yet among those Ensure provisions: no stage writes them yet.
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
)

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

// TurnLogWildcard is the subject filter of every event of turn in
// partition i: the compare-and-set of an append is against its last
// message.
func TurnLogWildcard(i int, turn string) string {
	return SubjectTurnLogPrefix + strconv.Itoa(i) + "." + turn + ".>"
}

// TurnLogStreams are c's turn-log streams, one per partition: Tollgate's
// stream limits, history and duplicate window (Streams), no atomic batch
// (each append is one compare-and-set), and direct gets as the buckets
// have them (DirectGets: a turn's last event is read back at once by
// another stage, so a replicated log is read from its leader).
func (c Config) TurnLogStreams() []jetstream.StreamConfig {
	out := make([]jetstream.StreamConfig, c.TurnLogPartitionCount())
	for i := range out {
		out[i] = c.streamBase(TurnLogStream(i), "Tollgate: turn logs, partition "+strconv.Itoa(i)+": each turn's events, appended by compare-and-set",
			SubjectTurnLogPrefix+strconv.Itoa(i)+".>")
		out[i].AllowDirect = c.DirectGets()
	}
	return out
}
