package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tollgate-dev/tollgate/seal"
)

var keysCmd = &command{
	name:    "keys",
	args:    "new|rotate|retire|list --file FILE [--id ID]",
	summary: "manage the TurnContext seal key file: new, rotate, retire, list (key ids only, never the keys)",
	example: "tollgate keys rotate --file ./.tollgate/seal-keys.json --id k2",
	run:     cmdKeys,
}

// cmdKeys manages a TurnContext seal key file (see package seal and
// docs/security.md):
//
//	tollgate keys new    --file F [--id k1]   create a key file (mode 0600, its directory 0700 if missing); refuses to overwrite
//	tollgate keys rotate --file F --id k2     add key k2 and make it current
//	tollgate keys retire --file F --id k1     remove a key that is no longer current
//	tollgate keys list   --file F             list key ids (never the keys)
//
// Each prints the file's current key id and key ids, with --json as a JSON
// object.
func cmdKeys(cmd *command, args []string) int {
	sub := ""
	if len(args) > 0 && (args[0] == "new" || args[0] == "rotate" || args[0] == "retire" || args[0] == "list") {
		sub, args = args[0], args[1:]
	}
	if len(args) > 0 && args[0] == "help" {
		args = []string{"-h"}
	}
	fs := cmd.flags()
	file := fs.String("file", "", "key file path (required)")
	id := fs.String("id", "", "key id: 1-32 characters of a-z 0-9 _ - (new: default k1)")
	asJSON := fs.Bool("json", false, "machine-readable JSON output")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	switch {
	case sub == "" && len(pos) > 0:
		return cmd.usageError("unknown subcommand %q", pos[0])
	case sub == "":
		return cmd.usageError("a subcommand is required")
	case len(pos) > 0:
		return cmd.usageError("unexpected arguments %q", pos)
	case *file == "":
		return cmd.usageError("--file is required")
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "tollgate keys %s: %v\n", sub, err)
		return 1
	}
	var f *seal.File
	switch sub {
	case "new":
		if *id == "" {
			*id = "k1"
		}
		if _, err := os.Stat(*file); err == nil {
			return fail(fmt.Errorf("%s exists; use rotate to add a key", *file))
		}
		f = seal.NewFile(*id)
		if _, err := f.Ring(); err != nil {
			return fail(err)
		}
		// The directory is made if missing, readable by the owner alone
		// like the file (an existing one keeps its mode).
		if err := os.MkdirAll(filepath.Dir(*file), 0o700); err != nil {
			return fail(fmt.Errorf("cannot create the directory of %s: %w", *file, err))
		}
		if err := f.Write(*file); err != nil {
			return fail(fmt.Errorf("cannot write %s: %w", *file, err))
		}
	case "rotate", "retire":
		if *id == "" {
			return fail(fmt.Errorf("--id is required"))
		}
		var err error
		if f, err = seal.ReadFile(*file); err != nil {
			return fail(err)
		}
		if sub == "rotate" {
			err = f.Rotate(*id)
		} else {
			err = f.Retire(*id)
		}
		if err != nil {
			return fail(err)
		}
		if err := f.Write(*file); err != nil {
			return fail(err)
		}
	case "list":
		var err error
		if f, err = seal.ReadFile(*file); err != nil {
			return fail(err)
		}
	}
	r, err := f.Ring()
	if err != nil {
		return fail(err)
	}
	switch {
	case *asJSON:
		printJSON(map[string]any{"file": *file, "current": r.Current(), "keys": r.IDs()})
	case sub == "list":
		fmt.Printf("current %s\nkeys    %v\n", r.Current(), r.IDs())
	case sub == "new":
		fmt.Printf("created %s with current key %s\n", *file, r.Current())
	default:
		fmt.Printf("%s: current key %s, keys %v; restart every stage to pick it up\n", *file, r.Current(), r.IDs())
	}
	return 0
}
