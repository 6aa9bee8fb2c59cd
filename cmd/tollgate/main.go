// Command tollgate is the all-in-one binary and operator CLI.
//
//	tollgate dev                      embedded nats-server + all four stages
//	tollgate send ...                 publish a chat message as a transport would
//	tollgate pending                  list pending approvals
//	tollgate show APPROVAL            everything a decider needs about one approval
//	tollgate approve|deny ID --as P   decide an approval
//	tollgate outcome TURN             show a turn's state, deciders and tool results
//	tollgate watch                    follow events as they happen
//	tollgate audit                    timeline of decisions and executions, from the streams
//	tollgate dlq                      list dead letters
//	tollgate grants list|show|revoke  standing grants: list, show with what each approved, revoke
//	tollgate tools                    list the tools an executor can call, with their policy modes
//	tollgate replay [--rebuild|--dry-run]  re-read the streams; rebuild KV or shadow a redrive
//	tollgate keys new|rotate|retire|list   manage the TurnContext seal key file
//	tollgate provision [--dry-run]    create or update streams, buckets and consumers (admin)
//	tollgate version (or --version)   Tollgate's, nats-server's and Go's versions
//	tollgate hook [install]           Claude Code's PreToolUse command hook; install it in .claude/settings.json
//	tollgate ingest|executor|approver|redriver|planner|gateway|slack|discord
//	                                  run one component as its own process (components.go)
//
// Every client command takes --nats (default: the dev server) and --json.
// Each command is in its own file; this one holds the dispatch table and the
// help every command shares. Help (-h, --help, tollgate help [COMMAND]) goes
// to stdout with exit status 0; a usage or flag error goes to stderr with
// exit status 2.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
)

// command is one tollgate command: its help and its entry point.
type command struct {
	name    string
	args    string // positional arguments and required flags, for the usage line
	summary string // one line
	example string
	// run runs the command with the arguments after its name and returns
	// the exit status. It must parse its flags (cmd.parse) before doing
	// anything, so that -h only prints help.
	run func(cmd *command, args []string) int
}

// commands is the dispatch table, in the order the usage lists them.
var commands = []*command{
	devCmd, sendCmd, chatCmd, pendingCmd, showCmd, approveCmd, denyCmd, outcomeCmd,
	watchCmd, auditCmd, dlqCmd, grantsCmd, toolsCmd, replayCmd, keysCmd, provisionCmd, versionCmd,
	hookCmd,
}

func main() { os.Exit(run(os.Args[1:])) }

// run dispatches args (without the program name) and returns the exit status.
func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage())
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		return help(args[1:])
	case "--version", "-version":
		return versionCmd.run(versionCmd, args[1:])
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(os.Stderr, "tollgate: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	return cmd.run(cmd, args[1:])
}

// help is `tollgate help [COMMAND]`: the usage, or the command's help.
func help(args []string) int {
	switch {
	case len(args) == 0 || len(args) == 1 && (args[0] == "-h" || args[0] == "--help"):
		fmt.Print(usage())
		return 0
	case len(args) > 1:
		fmt.Fprintf(os.Stderr, "tollgate: usage: tollgate help [COMMAND]\n")
		return 2
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(os.Stderr, "tollgate: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	return cmd.run(cmd, []string{"-h"})
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usage is the top-level help: one line per command.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: tollgate <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-8s  %s\n", "help", "show a command's help: tollgate help COMMAND")
	b.WriteString("\nRun 'tollgate <command> -h' for a command's arguments, flags and an example.\n")
	return b.String()
}

// flags returns the command's flag set. It prints nothing on -h (parse
// prints the help, on stdout) and reports flag errors on stderr.
func (c *command) flags() *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.Usage = func() {}
	return fs
}

// parse parses args with fs, allowing flags after positional arguments
// (tollgate approve ID --as alice), and returns the positional arguments.
// When the command must stop instead, ok is false and exit is its status:
// 0 after -h or --help printed the help on stdout, 2 after a flag error, or
// a malformed TOLLGATE_* variable a flag defaults from (scaffold.EnvErr),
// was reported on stderr.
func (c *command) parse(fs *flag.FlagSet, args []string) (pos []string, exit int, ok bool) {
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.printHelp(os.Stdout, fs)
			return nil, 0, false
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "run 'tollgate %s -h' for help\n", c.name)
			return nil, 2, false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			if err := scaffold.EnvErr(fs); err != nil {
				fmt.Fprintf(os.Stderr, "tollgate %s: %v\n", c.name, err)
				return nil, 2, false
			}
			return pos, 0, true
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// usageError reports a wrong use of the command on stderr and returns 2.
func (c *command) usageError(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "tollgate %s: %s\nusage: %s\n", c.name, fmt.Sprintf(format, args...), c.synopsis())
	return 2
}

func (c *command) synopsis() string {
	return strings.Join(strings.Fields("tollgate "+c.name+" "+c.args+" [flags]"), " ")
}

// printHelp writes the command's help to w: summary, usage, example, flags.
func (c *command) printHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "tollgate %s: %s\n\nusage: %s\n\nexample:\n  %s\n", c.name, c.summary, c.synopsis(), c.example)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprint(w, "\nflags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(nil)
	}
}
