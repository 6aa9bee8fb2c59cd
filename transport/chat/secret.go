package chat

import (
	"fmt"
	"os"
	"strings"
)

// Secret reads the chat transport secret name (a token, a key): the file
// named by $<name>_FILE (trimmed), else $<name>; empty when neither is set.
// Transports take secrets from here only, never from flags, and never log
// them.
func Secret(name string) (string, error) {
	if f := os.Getenv(name + "_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv(name), nil
}

// Configured reports whether secret name is set, in the environment or by
// file.
func Configured(name string) bool { return os.Getenv(name) != "" || os.Getenv(name+"_FILE") != "" }

// RequireSecret is Secret(name), refused with an error naming the
// variable (and when, e.g. " in HTTP mode") when it is not set.
func RequireSecret(name, when string) (string, error) {
	s, err := Secret(name)
	if err == nil && s == "" {
		err = fmt.Errorf("%s (or %s_FILE) is required%s", name, name, when)
	}
	return s, err
}
