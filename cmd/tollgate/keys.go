package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tollgate-dev/tollgate/seal"
)

// cmdKeys manages a TurnContext seal key file (see package seal and
// docs/security.md):
//
//	tollgate keys new    --file F [--id k1]   create a key file (mode 0600); refuses to overwrite
//	tollgate keys rotate --file F --id k2     add key k2 and make it current
//	tollgate keys retire --file F --id k1     remove a key that is no longer current
//	tollgate keys list   --file F             list key ids (never the keys)
func cmdKeys(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: tollgate keys new|rotate|retire|list --file F [--id ID]")
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("keys "+sub, flag.ContinueOnError)
	file := fs.String("file", "", "key file path (required)")
	id := fs.String("id", "", "key id: 1-32 characters of a-z 0-9 _ -")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *file == "" {
		fmt.Fprintln(os.Stderr, "tollgate keys: --file is required")
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "tollgate keys %s: %v\n", sub, err)
		return 1
	}
	switch sub {
	case "new":
		if *id == "" {
			*id = "k1"
		}
		if _, err := os.Stat(*file); err == nil {
			return fail(fmt.Errorf("%s exists; use rotate to add a key", *file))
		}
		if err := seal.NewFile(*id).Write(*file); err != nil {
			return fail(err)
		}
		fmt.Printf("created %s with current key %s\n", *file, *id)
	case "rotate", "retire":
		if *id == "" {
			return fail(fmt.Errorf("--id is required"))
		}
		f, err := seal.ReadFile(*file)
		if err != nil {
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
		fmt.Printf("%s: current key %s, keys %v; restart every stage to pick it up\n", *file, f.Current, mustRing(f).IDs())
	case "list":
		f, err := seal.ReadFile(*file)
		if err != nil {
			return fail(err)
		}
		r, err := f.Ring()
		if err != nil {
			return fail(err)
		}
		fmt.Printf("current %s\nkeys    %v\n", r.Current(), r.IDs())
	default:
		fmt.Fprintf(os.Stderr, "tollgate keys: unknown subcommand %q\n", sub)
		return 2
	}
	return 0
}

func mustRing(f *seal.File) *seal.KeyRing {
	r, err := f.Ring()
	if err != nil {
		panic(err) // Rotate and Retire validated it
	}
	return r
}
