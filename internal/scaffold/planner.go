package scaffold

import (
	"flag"
	"time"
)

// EnvLLMAPIKey holds the model endpoint's API key (or use --llm-key-file).
const EnvLLMAPIKey = "TOLLGATE_LLM_API_KEY"

// PlannerFlags are the planner's settings (docs/planner.md), each with a
// TOLLGATE_* environment default. The API key is never a flag value: it
// comes from EnvLLMAPIKey or from the file --llm-key-file names. They
// become the planner's options in internal/stagecmd (PlannerOptions), so
// that this package does not link the planner.
type PlannerFlags struct {
	URL, Model, KeyFile, PromptFile string
	Timeout, MaxWall                time.Duration
	MaxSteps                        int
	MaxTokens                       int64
}

// Register adds the planner flags to fs.
func (f *PlannerFlags) Register(fs *flag.FlagSet) {
	StringVar(fs, &f.URL, "llm-url", "TOLLGATE_LLM_URL", "", "OpenAI-compatible chat-completions API root, e.g. http://127.0.0.1:11434/v1; with --llm-model it turns the planner on (env TOLLGATE_LLM_URL)")
	StringVar(fs, &f.Model, "llm-model", "TOLLGATE_LLM_MODEL", "", "model name, e.g. qwen2.5:7b (env TOLLGATE_LLM_MODEL)")
	StringVar(fs, &f.KeyFile, "llm-key-file", "TOLLGATE_LLM_KEY_FILE", "", "file holding the model API key (default: env "+EnvLLMAPIKey+")")
	StringVar(fs, &f.PromptFile, "llm-system-prompt", "TOLLGATE_LLM_SYSTEM_PROMPT", "", "file holding the system prompt; empty for the built-in one (env TOLLGATE_LLM_SYSTEM_PROMPT)")
	DurationVar(fs, &f.Timeout, "llm-timeout", "TOLLGATE_LLM_TIMEOUT", 2*time.Minute, "timeout of one model request attempt (env TOLLGATE_LLM_TIMEOUT)")
	IntVar(fs, &f.MaxSteps, "llm-max-steps", "TOLLGATE_LLM_MAX_STEPS", 8, "model steps per turn (env TOLLGATE_LLM_MAX_STEPS)")
	Int64Var(fs, &f.MaxTokens, "llm-max-tokens", "TOLLGATE_LLM_MAX_TOKENS", 100000, "prompt plus completion tokens per turn (env TOLLGATE_LLM_MAX_TOKENS)")
	DurationVar(fs, &f.MaxWall, "llm-max-wall", "TOLLGATE_LLM_MAX_WALL", 30*time.Minute, "wall time per turn, waits for approvals included (env TOLLGATE_LLM_MAX_WALL)")
}

// Enabled reports whether a model endpoint is configured.
func (f PlannerFlags) Enabled() bool { return f.URL != "" || f.Model != "" }
