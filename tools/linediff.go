package tools

import (
	"fmt"
	"strings"
)

// maxDiffLines bounds each side of LineDiff: its table is (a+1)×(b+1)
// cells, so 2,000 lines a side is at most 16 MiB of int32.
const maxDiffLines = 2000

// diffContext is how many unchanged lines a hunk shows around a change.
const diffContext = 3

// LineDiff returns the unified diff (lines "@@ -a,n +b,m @@", then " ", "-"
// and "+" lines, as `diff -u` writes them, without the file header) that
// turns old into new, from a longest common subsequence of their lines.
// Equal texts give "". ok is false, and the diff "", when either side has
// more than 2,000 lines: the caller says so instead of diffing.
func LineDiff(old, new string) (diff string, ok bool) {
	a, b := splitLines(old), splitLines(new)
	if len(a) > maxDiffLines || len(b) > maxDiffLines {
		return "", false
	}
	// lcs[i][j]: length of the LCS of a[i:] and b[j:].
	w := len(b) + 1
	lcs := make([]int32, (len(a)+1)*w)
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
			} else {
				lcs[i*w+j] = max(lcs[(i+1)*w+j], lcs[i*w+j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-', '+'
		line string
	}
	var ops []op
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, op{' ', a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[(i+1)*w+j] >= lcs[i*w+j+1]):
			ops = append(ops, op{'-', a[i]}) // removals first, as diff -u
			i++
		default:
			ops = append(ops, op{'+', b[j]})
			j++
		}
	}
	var sb strings.Builder
	for k := 0; k < len(ops); {
		if ops[k].kind == ' ' {
			k++
			continue
		}
		// A hunk: from diffContext lines before this change to
		// diffContext lines after the last change within reach.
		start := max(0, k-diffContext)
		end := k
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*diffContext {
				end = min(run, end+diffContext)
				break
			}
			end = run
		}
		oldStart, newStart := 1, 1
		for _, o := range ops[:start] {
			if o.kind != '+' {
				oldStart++
			}
			if o.kind != '-' {
				newStart++
			}
		}
		oldN, newN := 0, 0
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				oldN++
			}
			if o.kind != '-' {
				newN++
			}
		}
		if oldN == 0 {
			oldStart-- // diff -u names the line before an empty range
		}
		if newN == 0 {
			newStart--
		}
		fmt.Fprintf(&sb, "@@ -%d,%d +%d,%d @@\n", oldStart, oldN, newStart, newN)
		for _, o := range ops[start:end] {
			sb.WriteByte(o.kind)
			sb.WriteString(o.line)
			sb.WriteByte('\n')
		}
		k = end
	}
	return sb.String(), true
}

// splitLines splits s into lines without their "\n"; a last line without
// one is a line too (so a missing final newline is not a difference), and
// "" has none.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
