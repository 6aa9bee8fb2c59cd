package store_test

import "testing"

// The store's contract holds when its writes go through a group committer
// (jetstream/groupcommit, the stages' default), where writes that wait
// together are committed as one atomic batch: the same tests, through it.
func TestThroughGroupCommit(t *testing.T) {
	groupCommit = true
	t.Cleanup(func() { groupCommit = false })
	for name, test := range map[string]func(*testing.T){
		"CreateThenGet":                TestCreateThenGet,
		"CreateExistingKey":            TestCreateExistingKey,
		"CreateAfterDelete":            TestCreateAfterDelete,
		"ConcurrentCreateHasOneWinner": TestConcurrentCreateHasOneWinner,
		"Update":                       TestUpdate,
		"UpdateRejectsInvalidRecord":   TestUpdateRejectsInvalidRecord,
		"MutateUnderContention":        TestMutateUnderContention,
		"MutateSkip":                   TestMutateSkip,
		"MutateError":                  TestMutateError,
		"MutateFromAKnownRevision":     TestMutateFromAKnownRevision,
	} {
		t.Run(name, test)
	}
}
