// Command executor runs Tollgate's executor stage against a NATS server with
// JetStream. Configure it with flags or TOLLGATE_* environment variables
// (run with -h for the list).
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func main() {
	os.Exit(stagecmd.Main(tollgate.StageExecutor, "127.0.0.1:9462", os.Args[1:]))
}
