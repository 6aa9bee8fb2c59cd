package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/nats-io/nats-server/v2/server"
)

var versionCmd = &command{
	name:    "version",
	summary: "print the versions of Tollgate, the nats-server it embeds, and Go",
	example: "tollgate version --json",
	run:     cmdVersion,
}

func cmdVersion(cmd *command, args []string) int {
	fs := cmd.flags()
	asJSON := fs.Bool("json", false, "machine-readable JSON output")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 {
		return cmd.usageError("no arguments expected, got %q", pos)
	}
	bi, _ := debug.ReadBuildInfo()
	v := tollgateVersion(bi, buildRevision)
	if *asJSON {
		printJSON(map[string]string{"tollgate": v, "nats_server": server.VERSION, "go": runtime.Version()})
		return 0
	}
	fmt.Printf("tollgate    %s\nnats-server %s\ngo          %s\n", v, server.VERSION, runtime.Version())
	return 0
}

// buildRevision is the VCS revision `make build` links in
// (-ldflags -X main.buildRevision=...), for builds where the go command
// records none (-buildvcs=false, a git worktree): "" when not set.
var buildRevision string

// tollgateVersion is the main module's version in bi: its release or
// pseudo-version when the build recorded one, else "devel", followed by the
// VCS revision (with "-dirty" for a modified tree) when the build recorded
// it, else by linked (the revision the Makefile links in) when set. bi may
// be nil (a binary built without module support).
func tollgateVersion(bi *debug.BuildInfo, linked string) string {
	devel := "devel"
	if linked != "" {
		devel += " " + linked
	}
	if bi == nil {
		return devel
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return devel
	}
	return "devel " + rev[:min(len(rev), 12)] + dirty
}
