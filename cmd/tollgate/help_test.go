package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

func TestHelpGoesToStdoutWithExitStatusZero(t *testing.T) {
	for _, cmd := range commands {
		for _, args := range [][]string{{cmd.name, "-h"}, {cmd.name, "--help"}, {"help", cmd.name}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, args...)
				if code != 0 || errOut != "" {
					t.Fatalf("exit %d, stderr %q; want 0 and nothing on stderr", code, errOut)
				}
				for _, want := range []string{cmd.summary, "usage: " + cmd.synopsis(), "example:\n  tollgate " + cmd.name} {
					if !strings.Contains(out, want) {
						t.Fatalf("help does not say %q:\n%s", want, out)
					}
				}
			})
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"help", "-h"}} {
		t.Run("tollgate "+strings.Join(args, " ")+" lists every command", func(t *testing.T) {
			code, out, errOut := runCLI(t, args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing on stderr", code, errOut)
			}
			for _, cmd := range commands {
				if !strings.Contains(out, "  "+cmd.name+" ") || !strings.Contains(out, cmd.summary) {
					t.Fatalf("usage does not list %s:\n%s", cmd.name, out)
				}
			}
		})
	}
	for _, args := range [][]string{{"keys", "list", "-h"}, {"keys", "help"}} {
		t.Run(strings.Join(args, " ")+" is the keys help", func(t *testing.T) {
			code, out, errOut := runCLI(t, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "usage: tollgate keys new|rotate|retire|list") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
}

func TestUsageErrorsExitTwoOnStderr(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"no command", nil, "usage: tollgate <command>"},
		{"an unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"help for an unknown command", []string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{"an unknown flag", []string{"pending", "--nope"}, "flag provided but not defined: -nope"},
		{"a flag value of the wrong type", []string{"outcome", "t-1", "--wait", "soon"}, "invalid value"},
		{"a missing positional argument", []string{"show"}, "usage: tollgate show APPROVAL_ID"},
		{"send without a sender", []string{"send", "--session", "s"}, "--session and --sender are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != 2 || out != "" || !strings.Contains(errOut, tc.says) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2, nothing on stdout, and %q on stderr", code, out, errOut, tc.says)
			}
		})
	}
}

func TestHelpShowsTheDefaultTimeoutACommandRunsWith(t *testing.T) {
	for _, tc := range []struct{ cmd, want string }{
		{"replay", "(default 10m0s)"}, // a replay reads the whole history
		{"pending", "(default 10s)"},
	} {
		_, out, _ := runCLI(t, tc.cmd, "-h")
		i := strings.Index(out, "-timeout")
		if i < 0 || !strings.Contains(strings.SplitAfterN(out[i:], "\n", 3)[1], tc.want) {
			t.Fatalf("%s -h does not give --timeout the default %s:\n%s", tc.cmd, tc.want, out)
		}
	}
}

func TestVersionNamesTollgateNATSServerAndGo(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"a release", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"a pseudo-version from the module's VCS stamp", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260102030405-0123456789ab+dirty"}}, "v0.0.0-20260102030405-0123456789ab+dirty"},
		{"a development build with its revision", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}}, "devel 0123456789ab"},
		{"a development build of a modified tree", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}, "devel 0123456789ab-dirty"},
		{"a development build without VCS information", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"no build information", nil, "devel"},
		{"a development build without VCS information, linked by make build", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel 72fcad3-dirty"},
		{"the build's own VCS stamp before the linked one", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}}, "devel 0123456789ab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			linked := ""
			if strings.Contains(tc.name, "linked") {
				linked = "72fcad3-dirty"
			}
			if got := tollgateVersion(tc.bi, linked); got != tc.want {
				t.Fatalf("tollgateVersion = %q, want %q", got, tc.want)
			}
		})
	}
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, errOut := runCLI(t, args...)
		if code != 0 || !strings.Contains(out, "nats-server "+server.VERSION) || !strings.Contains(out, runtime.Version()) || !strings.HasPrefix(out, "tollgate ") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}
