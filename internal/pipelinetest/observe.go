// The effects outside the streams: files the write_file tool left in the
// sandbox, and the stages' metrics with the wait on one.

package pipelinetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/metrics"
)

// File reads path inside the write_file sandbox.
func (h *H) File(path string) (content string, exists bool) {
	h.T.Helper()
	b, err := os.ReadFile(filepath.Join(h.Sandbox, path))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		h.T.Fatalf("pipelinetest: read %s: %v", path, err)
	}
	return string(b), true
}

// RemoveFile removes path from the sandbox if it exists.
func (h *H) RemoveFile(path string) {
	h.T.Helper()
	if err := os.Remove(filepath.Join(h.Sandbox, path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.T.Fatalf("pipelinetest: remove %s: %v", path, err)
	}
}

// SandboxFiles lists every regular file in the sandbox (relative paths).
func (h *H) SandboxFiles() []string {
	h.T.Helper()
	var out []string
	err := filepath.WalkDir(h.Sandbox, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(h.Sandbox, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		h.T.Fatalf("pipelinetest: walk sandbox: %v", err)
	}
	slices.Sort(out)
	return out
}

// Metric returns the value of the counter or gauge name whose labels include
// labels, summed over matching series; 0 if there is none.
func (h *H) Metric(name string, labels map[string]string) float64 {
	h.T.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		h.T.Fatalf("pipelinetest: gather: %v", err)
	}
	return metrics.Sum(mfs, name, labels)
}

// WaitMetric polls Metric until it equals want.
func (h *H) WaitMetric(name string, labels map[string]string, want float64) {
	h.T.Helper()
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("metric %s%v == %v", name, labels, want), func() bool {
		return h.Metric(name, labels) == want
	})
}
