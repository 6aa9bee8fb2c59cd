// Package soak holds long-running tests that are not part of `make test`.
//
// The retention soak (TestRetentionSoak, `make soak-retention`) drives a
// real pipeline (tollgate.New on an embedded nats-server, through
// internal/pipelinetest) with a short retention, so that the records of
// ended turns expire under load, and checks that the bytes of the records
// (the buckets', and the turn logs', which keep the batch records and
// leave with the streams' max age) reach a plateau while no safety rule is
// broken. It skips unless TOLLGATE_SOAK_TURNS is set. Parameters
// (environment):
//
//   - TOLLGATE_SOAK_TURNS: turns to drive (make: 200000);
//   - TOLLGATE_SOAK_RETENTION: the retention, and the streams' max age
//     (default 20s);
//   - TOLLGATE_SOAK_CONCURRENCY: turns in flight (default 64);
//   - TOLLGATE_SOAK_APPROVAL_EVERY: every n-th turn also makes a call that
//     needs an approval, which a decider approves as soon as it is
//     requested (default 5);
//   - TOLLGATE_SOAK_SAMPLE: the interval between samples of the buckets',
//     turn logs' and streams' bytes (default 2s);
//   - TOLLGATE_SOAK_OUT: where the curve is written, as CSV and JSON
//     (default results/soak under the repository root).
package soak
