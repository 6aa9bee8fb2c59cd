package main

import (
	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/discordcmd"
	"github.com/tollgate-dev/tollgate/internal/gatewaycmd"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/slackcmd"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

// components are the long-running processes this binary runs as
// subcommands (`tollgate ingest`, `tollgate gateway`, ...): the same code
// as their own binaries (cmd/ingest, cmd/gateway, ...), so that one binary
// (and one image) deploys every part. Each parses its own flags: -h prints
// its help on stdout with exit status 0; a flag error, or a TOLLGATE_*
// variable its flags cannot read, exits 2.
var components = []scaffold.Component{
	stagecmd.Stage(tollgate.StageIngest), stagecmd.Stage(tollgate.StageExecutor),
	stagecmd.Stage(tollgate.StageApprover), stagecmd.Stage(tollgate.StageRedriver),
	stagecmd.Stage(tollgate.StagePlanner),
	gatewaycmd.Component, slackcmd.Component, discordcmd.Component,
}

// The components follow the operator commands in the dispatch table.
func init() {
	for _, c := range components {
		commands = append(commands, &command{
			name: c.Name, args: c.Args, summary: c.Summary, example: "tollgate " + c.Name + " " + c.Example,
			run: func(cmd *command, args []string) int { return c.Run("tollgate "+cmd.name, args) },
		})
	}
}
