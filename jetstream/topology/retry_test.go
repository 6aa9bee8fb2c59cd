package topology_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

func TestRetryTriesTransientErrorsAgainOnly(t *testing.T) {
	defer topology.SetRetryWait(time.Millisecond)()
	cases := []struct {
		name  string
		err   error
		calls int
	}{
		{"timeout", fmt.Errorf("ensure stream X: %w", context.DeadlineExceeded), topology.RetryAttempts},
		{"nats timeout", nats.ErrTimeout, topology.RetryAttempts},
		{"no meta leader yet", &jetstream.APIError{Code: 503, ErrorCode: 10008}, topology.RetryAttempts},
		{"created concurrently", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse}, topology.RetryAttempts},
		{"insufficient resources", &jetstream.APIError{Code: 500, ErrorCode: 10023}, 1},
		{"anything else", errors.New("bad config"), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := topology.Retry(context.Background(), func() error { calls++; return tc.err })
			if !errors.Is(err, tc.err) || calls != tc.calls {
				t.Fatalf("%d calls, error %v; want %d calls and the error", calls, err, tc.calls)
			}
		})
	}
	calls := 0
	err := topology.Retry(context.Background(), func() error {
		if calls++; calls < 3 {
			return context.DeadlineExceeded
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("%d calls, error %v; want success on the third", calls, err)
	}
}
