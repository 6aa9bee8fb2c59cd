// Command gateway runs the same code as `tollgate gateway` (package
// internal/gatewaycmd), for those who install or script one component: run
// it with -h for its flags and TOLLGATE_* environment variables.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate/internal/gatewaycmd"
)

func main() { os.Exit(gatewaycmd.Component.Run("gateway", os.Args[1:])) }
