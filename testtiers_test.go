package tollgate_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEveryLongTestIsInTestLong: make test runs go test with -short, and
// make test-long runs, without it, the packages the Makefile lists in
// LONG_PKGS. A package whose tests call testing.Short() and that is not
// listed would have those tests run nowhere (CI runs both targets); a
// listed package with none runs its quick tests twice for nothing.
func TestEveryLongTestIsInTestLong(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LONG_PKGS\s*:=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no LONG_PKGS")
	}
	listed := strings.Fields(string(m[1]))

	var have []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Not this module's packages: npm packages, the Helm chart's
			// module (make test-helm), the local store.
			if name := d.Name(); name == "node_modules" || name == "testdata" || path == "deploy/helm" || strings.HasPrefix(name, ".") && path != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") || path == "testtiers_test.go" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(src), "testing.Short()") {
			if pkg := "./" + filepath.ToSlash(filepath.Dir(path)); !slices.Contains(have, pkg) {
				have = append(have, pkg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range have {
		if !slices.Contains(listed, pkg) {
			t.Errorf("%s has tests that skip under -short but is not in the Makefile's LONG_PKGS: they would run nowhere", pkg)
		}
	}
	for _, pkg := range listed {
		if !slices.Contains(have, pkg) {
			t.Errorf("LONG_PKGS lists %s, whose tests never skip under -short", pkg)
		}
	}
}

// TestCIRunsWhatMakeTestLeavesOut: make test runs some test phases and
// make check the rest (the long tests, the Helm chart's, lint); .ci/run
// must run both, and every phase must be in one of them, or CI would not
// run it.
func TestCIRunsWhatMakeTestLeavesOut(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"make test", "make check"} {
		if !regexp.MustCompile(`(?m)^` + cmd + `$`).Match(ci) {
			t.Errorf(".ci/run does not run %q on a line of its own", cmd)
		}
	}
	test := regexp.MustCompile(`(?m)^test:\n\t@\$\(MAKE\) .*-Otarget (.*)$`).FindSubmatch(mk)
	check := regexp.MustCompile(`(?m)^CHECK_TARGETS\s*:=\s*(.*)$`).FindSubmatch(mk)
	if test == nil || check == nil {
		t.Fatal("Makefile: no test recipe or no CHECK_TARGETS")
	}
	run := append(strings.Fields(string(test[1])), strings.Fields(string(check[1]))...)
	for _, phase := range []string{"test-go", "test-clients", "test-long", "test-helm", "lint"} {
		if n := slices.Index(run, phase); n < 0 {
			t.Errorf("make test and make check leave out %s: CI would not run it", phase)
		} else if slices.Contains(run[n+1:], phase) {
			t.Errorf("make test and make check both run %s", phase)
		}
	}
}
