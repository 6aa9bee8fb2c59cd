// Command executor runs Tollgate's executor stage against a NATS server with
// JetStream. Configure it with flags or TOLLGATE_* environment variables
// (run with -h for the list). It is
// the same code as `tollgate executor`.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func main() { os.Exit(stagecmd.Stage(tollgate.StageExecutor).Run("executor", os.Args[1:])) }
