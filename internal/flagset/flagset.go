// Package flagset tells which flags and TOLLGATE_* environment variables a
// Tollgate binary takes, for the tests that check deployment files
// (deploy/compose, deploy/helm) against the real binaries: a stage's flag
// set as the stage binaries build it, or any binary's as its -h output
// shows it.
package flagset

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

// Binary is what one binary (or tollgate subcommand) takes: its flag set
// (to parse a deployment's arguments with) and the environment variables
// its flags' help names.
type Binary struct {
	Flags *flag.FlagSet
	Env   map[string]bool
}

// envName is a TOLLGATE_* variable named in a flag's help.
var envName = regexp.MustCompile(`TOLLGATE_[A-Z0-9_]+`)

// Stage is stage's binary, its flags built as the stage binaries build
// them (stagecmd.StageFlags into c).
func Stage(stage string, c *scaffold.Common) Binary {
	fs := stagecmd.StageFlags(stage, "", c)
	fs.SetOutput(io.Discard)
	b := Binary{Flags: fs, Env: map[string]bool{}}
	fs.VisitAll(func(f *flag.Flag) {
		for _, v := range envName.FindAllString(f.Usage, -1) {
			b.Env[v] = true
		}
	})
	return b
}

// Help runs bin with args and -h and rebuilds the flag set from the help
// it prints (the flag package's "  -name type" lines; a flag with no type
// is a bool), with the TOLLGATE_* variables its help names. It fails when
// the binary fails otherwise than the flag package does on -h, or prints
// no flag.
func Help(bin string, args ...string) (Binary, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(args, "-h")...).CombinedOutput()
	var exit *exec.ExitError
	// Tollgate's binaries print help on stdout with status 0
	// (scaffold.Parse); a plain flag set prints it on stderr with
	// status 2 (flag.ErrHelp).
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 2) {
		return Binary{}, fmt.Errorf("%s %v -h: %w\n%s", filepath.Base(bin), args, err, out)
	}
	fs := flag.NewFlagSet(filepath.Base(bin), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	b := Binary{Flags: fs, Env: map[string]bool{}}
	line := regexp.MustCompile(`^  -([a-z][a-z0-9-]*)(?: (\S+))?$`)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	n := 0
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			n++
			if m[2] == "" {
				fs.Bool(m[1], false, "")
			} else {
				fs.String(m[1], "", "")
			}
		}
		for _, v := range envName.FindAllString(sc.Text(), -1) {
			b.Env[v] = true
		}
	}
	if n == 0 {
		return Binary{}, fmt.Errorf("%s %v -h printed no flags:\n%s", filepath.Base(bin), args, out)
	}
	return b, nil
}
