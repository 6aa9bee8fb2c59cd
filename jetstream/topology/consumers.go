package topology

import "github.com/nats-io/nats.go/jetstream"

// ConsumerSpec is a stage's durable consumer as the topology defines it:
// the stream it reads, and a consumer configuration holding the durable
// name and the filter subject(s). How the stage consumes (ack wait, max
// deliver, max ack pending) is the stage's runner's to add (see
// pipeline/runner and tollgate.StageConsumers, which provisioning and the
// --no-provision check use); the stream, name and filters are decided only
// here.
type ConsumerSpec struct {
	Stream string
	Config jetstream.ConsumerConfig
}

// IngestConsumer reads every inbound message of every transport.
func IngestConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamInbound, Config: jetstream.ConsumerConfig{
		Durable:       ConsumerIngest,
		FilterSubject: SubjectInboundPrefix + ">",
	}}
}

// ExecutorConsumer reads the executor's entries of the sessions' orders
// (OrderFilter(OrderExec): the turns ingest accepts), the accepted subject
// (the planner's step batches, scheduled follow-ups when they are due, and
// the turns an earlier version accepted there) and session-ready notices.
// Not the schedule subject: a scheduled follow-up arrives on the accepted
// subject when it is due.
func ExecutorConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamTurns, Config: jetstream.ConsumerConfig{
		Durable:        ConsumerExecutor,
		FilterSubjects: []string{OrderFilter(OrderExec), SubjectTurnAccepted + "*", SubjectTurnReady + "*"},
	}}
}

// ApproverConsumer reads the decisions every transport submits.
func ApproverConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamDecisions, Config: jetstream.ConsumerConfig{
		Durable:       ConsumerApprover,
		FilterSubject: SubjectDecisionSubmit + ">",
	}}
}

// RedriverConsumer reads every revision of the approvals bucket
// (StreamApprovals): each approval's decision is the revision that holds
// it decided (pipeline/store, DecidedOf), and the redriver evaluates its
// batch's barrier on it. Made with DeliverAll, so that a redriver
// upgraded from one that read approval-decided events hears every
// decision the bucket keeps.
func RedriverConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamApprovals, Config: jetstream.ConsumerConfig{
		Durable:       ConsumerRedriver,
		FilterSubject: ApprovalRevisions,
	}}
}

// RedriverNoticesConsumer reads the batch-awaiting notices that a batch
// kept in the batches bucket (an earlier version's turn) is still
// announced by. It is the durable through which an earlier redriver read
// approval-decided events too; decisions are the approvals bucket's now
// (RedriverConsumer), so its filter no longer names them.
func RedriverNoticesConsumer() ConsumerSpec {
	return ConsumerSpec{Stream: StreamEvents, Config: jetstream.ConsumerConfig{
		Durable:       ConsumerRedriver,
		FilterSubject: SubjectBatchAwaiting + "*",
	}}
}

// Consumers returns the four stages' consumers in pipeline order: ingest,
// executor, approver, redriver.
func Consumers() []ConsumerSpec {
	return []ConsumerSpec{IngestConsumer(), ExecutorConsumer(), ApproverConsumer(), RedriverConsumer()}
}
