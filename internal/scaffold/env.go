package scaffold

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// EnvError is a TOLLGATE_* variable whose value its reader does not accept
// (a duration without a unit, a boolean spelled "yes"). A binary refuses
// it at start with exit status 2, naming the variable: a malformed value
// never silently means the default.
type EnvError struct {
	Name, Value string
	Err         error
}

func (e *EnvError) Error() string {
	return fmt.Sprintf("environment variable %s=%q: %v", e.Name, e.Value, e.Err)
}

func (e *EnvError) Unwrap() error { return e.Err }

// envTyped reads the variable name with parse, or returns def when it is
// unset or empty. A value parse refuses is an *EnvError, returned with def.
func envTyped[T any](name string, def T, parse func(string) (T, error)) (T, error) {
	s, ok := os.LookupEnv(name)
	if !ok || s == "" {
		return def, nil
	}
	v, err := parse(s)
	if err != nil {
		return def, &EnvError{Name: name, Value: s, Err: err}
	}
	return v, nil
}

// EnvDuration reads a Go duration (90s, 2m, 1h30m) from name.
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	return envTyped(name, def, time.ParseDuration)
}

// EnvBool reads a boolean from name: 1, t, true, 0, f, false (any case, as
// strconv.ParseBool and the flag package accept).
func EnvBool(name string, def bool) (bool, error) {
	return envTyped(name, def, strconv.ParseBool)
}

// EnvInt reads a decimal integer from name.
func EnvInt(name string, def int) (int, error) {
	return envTyped(name, def, strconv.Atoi)
}

// EnvInt64 reads a decimal 64-bit integer from name.
func EnvInt64(name string, def int64) (int64, error) {
	return envTyped(name, def, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
}

// ParseLevel is the log level a --log-level value or TOLLGATE_LOG_LEVEL
// names: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// The flag registrations below add a flag whose default is read from the
// environment variable env (def when it is unset or empty). A value the
// reader refuses leaves the default in place and marks the flag, so that
// EnvErr (and Parse) refuse to go on: the flag's help is unchanged.

// DurationVar is fs.DurationVar with its default from env (EnvDuration).
func DurationVar(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	v, err := EnvDuration(env, def)
	fs.DurationVar(p, name, v, usage)
	markBad(fs, name, err)
}

// BoolVar is fs.BoolVar with its default from env (EnvBool).
func BoolVar(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	v, err := EnvBool(env, def)
	fs.BoolVar(p, name, v, usage)
	markBad(fs, name, err)
}

// IntVar is fs.IntVar with its default from env (EnvInt).
func IntVar(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	v, err := EnvInt(env, def)
	fs.IntVar(p, name, v, usage)
	markBad(fs, name, err)
}

// Int64Var is fs.Int64Var with its default from env (EnvInt64).
func Int64Var(fs *flag.FlagSet, p *int64, name, env string, def int64, usage string) {
	v, err := EnvInt64(env, def)
	fs.Int64Var(p, name, v, usage)
	markBad(fs, name, err)
}

// StringVar is fs.StringVar with its default from env (Env).
func StringVar(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	fs.StringVar(p, name, Env(env, def), usage)
}

// LevelVar is a --log-level flag with its default from env: a level that
// ParseLevel refuses, from env or from the command line, is refused by
// Parse and EnvErr.
func LevelVar(fs *flag.FlagSet, p *string, name, env, usage string) {
	s := Env(env, "")
	_, err := ParseLevel(s)
	if *p = s; s == "" || err != nil {
		*p = "info"
	}
	fs.Var(&levelValue{p: p}, name, usage)
	if s != "" && err != nil {
		markBad(fs, name, &EnvError{Name: env, Value: s, Err: err})
	}
}

// levelValue is a string flag that accepts only a log level.
type levelValue struct{ p *string }

func (v *levelValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return *v.p
}

func (v *levelValue) Set(s string) error {
	if _, err := ParseLevel(s); err != nil {
		return err
	}
	*v.p = s
	return nil
}

// markBad marks fs's flag name as defaulting from a malformed variable
// (err, when not nil), for EnvErr.
func markBad(fs *flag.FlagSet, name string, err error) {
	if err == nil {
		return
	}
	f := fs.Lookup(name)
	bad := badEnv{Value: f.Value, err: err}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		f.Value = &badBoolEnv{bad}
		return
	}
	f.Value = &bad
}

// badEnv is a flag's value whose default came from a malformed variable.
type badEnv struct {
	flag.Value
	err error
}

func (v *badEnv) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

// badBoolEnv is a boolean flag's: it still takes no argument.
type badBoolEnv struct{ badEnv }

func (*badBoolEnv) IsBoolFlag() bool { return true }

// EnvErr is the malformed environment variables fs's flags default from
// (each an *EnvError, joined), or nil. A malformed value is refused even
// when its flag is given too: the environment is wrong either way.
func EnvErr(fs *flag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case *badEnv:
			errs = append(errs, v.err)
		case *badBoolEnv:
			errs = append(errs, v.err)
		}
	})
	return errors.Join(errs...)
}

// Parse parses args with fs (built with flag.ContinueOnError) as every
// Tollgate binary does, and returns whether to go on, or the exit status:
// on -h or --help it prints help (usage, then the flags) on stdout and
// returns 0; on a flag error, or a malformed environment variable a flag
// defaults from (EnvErr), it reports it on stderr, naming the flag or the
// variable, and returns 2.
func Parse(fs *flag.FlagSet, usage string, args []string) (exit int, ok bool) {
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		PrintHelp(os.Stdout, fs, usage)
		return 0, false
	}
	if err != nil { // the flag package has reported it on stderr
		fmt.Fprintf(os.Stderr, "run '%s -h' for help\n", fs.Name())
		return 2, false
	}
	if err := EnvErr(fs); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

// PrintHelp writes usage and then fs's flags to w.
func PrintHelp(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprint(w, usage)
	fmt.Fprint(w, "\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(nil)
}
