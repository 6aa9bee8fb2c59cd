// Command slack runs the same code as `tollgate slack` (package
// internal/slackcmd), for those who install or script one component: run
// it with -h for its flags and TOLLGATE_* environment variables.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate/internal/slackcmd"
)

func main() { os.Exit(slackcmd.Component.Run("slack", os.Args[1:])) }
