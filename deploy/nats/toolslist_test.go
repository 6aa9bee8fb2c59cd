package natsconf_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The executor, under its own user, serves the tool list (as the NATS
// service tollgate-tools) without a permissions violation; admin, which
// `tollgate tools` runs as, may ask for it; a transport may not.
func TestTheToolListIsServedByTheExecutorAndAskedByAdmin(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	stages, _ := runStages(t, ns, t.TempDir())

	var l schemas.ToolList
	eventually(t, "the tool list, asked by admin", func(c context.Context) bool {
		msg, err := admin.nc.RequestWithContext(c, topology.SubjectToolsList, nil)
		return err == nil && json.Unmarshal(msg.Data, &l) == nil
	})
	var names []string
	for _, tool := range l.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); got != "echo schedule_followup write_file" || l.PolicyVersion != "builtin-1" {
		t.Fatalf("tool list %s under %s", got, l.PolicyVersion)
	}
	if errs := stages["executor"].reported(); len(errs) != 0 {
		t.Fatalf("the executor's user was refused something serving the list: %v", errs)
	}
	if errs := admin.reported(); len(errs) != 0 {
		t.Fatalf("admin was refused something asking for the list: %v", errs)
	}

	cli := dial(t, ns, "cli")
	done := make(chan error, 1)
	go func() {
		_, err := cli.nc.Request(topology.SubjectToolsList, nil, wait)
		done <- err
	}()
	cli.waitDenied(t, topology.SubjectToolsList, done)
}
