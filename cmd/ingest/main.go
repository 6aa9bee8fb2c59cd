// Command ingest runs Tollgate's ingest stage against a NATS server with
// JetStream. Configure it with flags or TOLLGATE_* environment variables
// (run with -h for the list).
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func main() {
	os.Exit(stagecmd.Main(tollgate.StageIngest, "127.0.0.1:9461", os.Args[1:]))
}
