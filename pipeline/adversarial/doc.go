// Package adversarial holds the end-to-end adversarial table test of the authority rules (issue 3).
package adversarial
