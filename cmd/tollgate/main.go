// Command tollgate is the all-in-one binary and operator CLI.
//
//	tollgate dev                      embedded nats-server + all four stages
//	tollgate send ...                 publish a chat message as a transport would
//	tollgate pending                  list pending approvals
//	tollgate approve|deny ID --as P   decide an approval
//	tollgate outcome TURN             show a turn's state and tool results
//	tollgate watch                    follow events as they happen
//	tollgate dlq                      list dead letters
//	tollgate replay [--rebuild|--dry-run]  re-read the streams; rebuild KV or shadow a redrive
//	tollgate keys new|rotate|retire   manage the TurnContext seal key file
//
// Every client command takes --nats (default: the dev server) and --json.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: tollgate <command> [flags]

commands:
  dev       run an embedded nats-server and all four stages (the laptop default)
  send      publish a chat message with proposed tool calls; prints the turn id
  pending   list pending approvals
  approve   approve a pending approval:  tollgate approve ID --as SENDER
  deny      deny a pending approval:     tollgate deny ID --as SENDER
  outcome   show a turn's state and results:  tollgate outcome TURN [--wait 10s]
  watch     follow events (approvals, decisions, redrives, outcomes)
  dlq       list dead-lettered messages with their reason codes
  replay    re-read the streams over a range of turns: report, --rebuild KV records, or --dry-run a redrive
  keys      manage the TurnContext seal key file: new, rotate, retire, list

Run 'tollgate <command> -h' for its flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmds := map[string]func([]string) int{
		"dev":     cmdDev,
		"send":    cmdSend,
		"pending": cmdPending,
		"approve": func(a []string) int { return cmdDecide("approve", a) },
		"deny":    func(a []string) int { return cmdDecide("deny", a) },
		"outcome": cmdOutcome,
		"watch":   cmdWatch,
		"dlq":     cmdDLQ,
		"replay":  cmdReplay,
		"keys":    cmdKeys,
	}
	run, ok := cmds[os.Args[1]]
	if !ok {
		if os.Args[1] != "-h" && os.Args[1] != "help" && os.Args[1] != "--help" {
			fmt.Fprintf(os.Stderr, "tollgate: unknown command %q\n\n", os.Args[1])
		}
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	os.Exit(run(os.Args[2:]))
}
