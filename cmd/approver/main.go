// Command approver runs Tollgate's approver stage against a NATS server with
// JetStream. Configure it with flags or TOLLGATE_* environment variables
// (run with -h for the list). It is
// the same code as `tollgate approver`.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func main() { os.Exit(stagecmd.Stage(tollgate.StageApprover).Run("approver", os.Args[1:])) }
