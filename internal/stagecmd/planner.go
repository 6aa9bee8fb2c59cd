package stagecmd

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
)

// PlannerOptions returns the planner options of the flags f, or nil when
// no model endpoint is configured (f.Enabled). It fails when only one of
// --llm-url and --llm-model is given, or a file cannot be read.
func PlannerOptions(f scaffold.PlannerFlags) (*planner.Options, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.URL == "" || f.Model == "" {
		return nil, errors.New("planner: --llm-url and --llm-model go together")
	}
	key := os.Getenv(scaffold.EnvLLMAPIKey)
	if f.KeyFile != "" {
		b, err := os.ReadFile(f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("planner: --llm-key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	o := &planner.Options{
		Model:  planner.ModelConfig{BaseURL: f.URL, Model: f.Model, APIKey: key, Timeout: f.Timeout},
		Budget: planner.Budget{MaxSteps: f.MaxSteps, MaxTokens: f.MaxTokens, MaxWall: f.MaxWall},
	}
	if f.PromptFile != "" {
		b, err := os.ReadFile(f.PromptFile)
		if err != nil {
			return nil, fmt.Errorf("planner: --llm-system-prompt: %w", err)
		}
		o.SystemPrompt = string(b)
	}
	return o, nil
}
