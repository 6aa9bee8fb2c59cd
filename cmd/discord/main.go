// Command discord runs the same code as `tollgate discord` (package
// internal/discordcmd), for those who install or script one component: run
// it with -h for its flags and TOLLGATE_* environment variables.
package main

import (
	"os"

	"github.com/tollgate-dev/tollgate/internal/discordcmd"
)

func main() { os.Exit(discordcmd.Component.Run("discord", os.Args[1:])) }
