package main

import (
	"io"
	"os"
	"testing"
)

// runCLI runs `tollgate args...` in this process and returns its exit code
// and what it wrote to stdout and stderr. It swaps the process's os.Stdout
// and os.Stderr, so tests that use it must not run in parallel.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	capture := func(target **os.File) (restore func() string) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		saved := *target
		*target = w
		done := make(chan string)
		go func() {
			b, _ := io.ReadAll(r)
			r.Close()
			done <- string(b)
		}()
		return func() string {
			*target = saved
			w.Close()
			return <-done
		}
	}
	restoreOut := capture(&os.Stdout)
	restoreErr := capture(&os.Stderr)
	func() {
		defer func() {
			stdout, stderr = restoreOut(), restoreErr()
		}()
		code = run(args)
	}()
	return code, stdout, stderr
}
