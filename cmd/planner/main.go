// Command planner runs Tollgate's planner stage (the agent loop:
// docs/planner.md) against a NATS server with JetStream. It needs a model
// endpoint (--llm-url, --llm-model; the API key from TOLLGATE_LLM_API_KEY or
// --llm-key-file), and ingest must route text-only messages to it
// (`ingest --plan`). Configure it with flags or TOLLGATE_* environment
// variables (run with -h for the list). It is
// the same code as `tollgate planner`.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func main() { os.Exit(stagecmd.Stage(tollgate.StagePlanner).Run("planner", os.Args[1:])) }
