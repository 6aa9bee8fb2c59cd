package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

var toolsCmd = &command{
	name:    "tools",
	summary: "list every tool an executor can call: source, description, argument schema, whether a re-run is safe, policy mode per audience",
	example: "tollgate tools --json",
	run:     cmdTools,
}

// cmdTools asks an executor for its tools (a request on
// tollgate.tools.list) and prints them: one block per tool, or the
// executor's answer as JSON with --json. The gateway's Claude Code gate
// tools (claude.*, one per Claude Code tool) are one block for them all
// unless --all is given; --json lists every tool.
func cmdTools(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	all := fs.Bool("all", false, "list each of the gateway's Claude Code gate tools (claude.*) too, not one line for them all")
	if exit, ok := c.startNoArgs(cmd, fs, args); !ok {
		return exit
	}
	defer c.close()
	msg, err := c.nc.Request(topology.SubjectToolsList, nil, c.timeout)
	if errors.Is(err, nats.ErrNoResponders) {
		return fail("tools: no executor answered on %s: is one running (tollgate dev, or the executor binary)?", topology.SubjectToolsList)
	}
	if err != nil {
		return c.fail("tools", err)
	}
	var l schemas.ToolList
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		return fail("tools: the executor's answer does not decode: %v", err)
	}
	for _, e := range l.Errors {
		fmt.Fprintf(os.Stderr, "tollgate tools: warning: %s\n", e)
	}
	if c.json {
		printJSON(l)
		return 0
	}
	fmt.Printf("policy %s, %d tools\n", l.PolicyVersion, len(l.Tools))
	var gates []schemas.ToolInfo
	for _, t := range l.Tools {
		if !*all && t.Source == claudeGateSource {
			gates = append(gates, t)
			continue
		}
		safe := "not safe to re-run"
		if t.RetrySafe {
			safe = "safe to re-run"
		}
		fmt.Printf("\n%s  (%s, %s)\n", t.Name, t.Source, safe)
		if t.Description != "" {
			fmt.Printf("  %s\n", t.Description)
		}
		var modes []string
		for _, a := range schemas.ToolAudiences {
			modes = append(modes, fmt.Sprintf("%s %s", a, t.Modes[a]))
		}
		fmt.Printf("  policy: %s\n", strings.Join(modes, ", "))
		if h := hintsText(t.Hints.ReadOnly, t.Hints.Destructive); h != "" {
			fmt.Printf("  claims: %s\n", h)
		}
		schema := "any JSON object"
		if len(t.InputSchema) > 0 {
			var b bytes.Buffer
			if json.Compact(&b, t.InputSchema) == nil {
				schema = b.String()
			} else {
				schema = string(t.InputSchema)
			}
		}
		fmt.Printf("  arguments: %s\n", schema)
	}
	printGates(gates)
	return 0
}

// claudeGateSource is the source of the gate tools the HTTP gateway serves
// for Claude Code's hooks (docs/api.md, "Claude Code hooks").
const claudeGateSource = "nats:" + gateway.ClaudeGateService

// printGates prints the Claude Code gate tools as one block: their names,
// and their policy modes when they all share them.
func printGates(gates []schemas.ToolInfo) {
	if len(gates) == 0 {
		return
	}
	fmt.Printf("\n%s.*  (%s, %d gate tools for Claude Code's hooks; --all lists each)\n", gateway.ClaudeGateService, claudeGateSource, len(gates))
	names := make([]string, len(gates))
	modes := map[string]bool{}
	for i, t := range gates {
		names[i] = t.Name
		var m []string
		for _, a := range schemas.ToolAudiences {
			m = append(m, fmt.Sprintf("%s %s", a, t.Modes[a]))
		}
		modes[strings.Join(m, ", ")] = true
	}
	fmt.Printf("  %s\n", strings.Join(names, " "))
	if len(modes) == 1 {
		for m := range modes {
			fmt.Printf("  policy: %s\n", m)
		}
	} else {
		fmt.Printf("  policy: differs between them (--all shows each)\n")
	}
}

// hintsText says what a tool claims about its effects, or "" if nothing.
func hintsText(readOnly, destructive *bool) string {
	var s []string
	if readOnly != nil {
		s = append(s, fmt.Sprintf("read-only %v", *readOnly))
	}
	if destructive != nil {
		s = append(s, fmt.Sprintf("destructive %v", *destructive))
	}
	return strings.Join(s, ", ")
}
