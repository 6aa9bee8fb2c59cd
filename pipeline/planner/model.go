package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// ModelConfig is the OpenAI-compatible chat-completions endpoint the
// planner asks: OpenAI, Ollama, vLLM, llama.cpp's server, ...
type ModelConfig struct {
	// BaseURL is the API root, e.g. http://127.0.0.1:11434/v1 (required).
	BaseURL string
	// Model is the model name sent with every request (required).
	Model string
	// APIKey is sent as a bearer token; "" sends none that matters (local
	// servers ignore it).
	APIKey string
	// Timeout bounds one HTTP attempt (default 2m).
	Timeout time.Duration
	// MaxRetries is how often a failed attempt (connection error, 408, 409,
	// 429, 5xx) is retried with exponential back-off, honouring
	// Retry-After (default 3; negative: none).
	MaxRetries int
	// MaxRetryDelay caps one back-off (default 10s).
	MaxRetryDelay time.Duration
}

// model is the chat-completions client.
type model struct {
	cfg  ModelConfig
	chat openai.ChatCompletionService
}

func newModel(cfg ModelConfig) (*model, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, errors.New("planner: model BaseURL and Model are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = 3
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	if cfg.MaxRetryDelay <= 0 {
		cfg.MaxRetryDelay = 10 * time.Second
	}
	// The service is built from explicit options only: unlike
	// openai.NewClient, it reads no OPENAI_* environment variables, so
	// what the planner talks to is exactly its configuration.
	chat := openai.NewChatCompletionService(
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(&http.Client{}),
		option.WithRequestTimeout(cfg.Timeout),
		option.WithMaxRetries(cfg.MaxRetries),
		option.WithMaxRetryDelay(cfg.MaxRetryDelay),
	)
	return &model{cfg: cfg, chat: chat}, nil
}

// answer is what one model step returned.
type answer struct {
	text      string
	calls     []rawCall
	tokensIn  int64
	tokensOut int64
}

// rawCall is a tool call as the model sent it.
type rawCall struct {
	id, kind, name, args string
}

// ask sends one chat-completions request. Its errors: the context's own
// error when ctx ends (the caller retries later: nothing is decided); a
// CodeLLMUnavailable error when the endpoint cannot be reached or answers
// with an error status after the retries; a CodeLLMBadResponse error when
// the answer is not a usable completion.
func (m *model) ask(ctx context.Context, msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam) (a *answer, err error) {
	ctx, span := tracing.Start(ctx, "model "+m.cfg.Model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("gen_ai.request.model", m.cfg.Model), attribute.Int("gen_ai.request.messages", len(msgs))))
	defer func() {
		if a != nil {
			span.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", a.tokensIn), attribute.Int64("gen_ai.usage.output_tokens", a.tokensOut),
				attribute.Int("tollgate.tool_calls", len(a.calls)))
		}
		tracing.End(span, err)
	}()
	params := openai.ChatCompletionNewParams{Model: m.cfg.Model, Messages: msgs, Tools: tools}
	res, err := m.chat.New(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var apiErr *openai.Error
		if errors.As(err, &apiErr) {
			return nil, schemas.Errorf(schemas.CodeLLMUnavailable, "model endpoint answered %d: %s", apiErr.StatusCode, clip(apiErr.Message, 200))
		}
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syn) || errors.As(err, &typ) || strings.Contains(err.Error(), "unmarshal") {
			return nil, schemas.Errorf(schemas.CodeLLMBadResponse, "model answer is not a chat completion: %s", clip(err.Error(), 200))
		}
		return nil, schemas.Errorf(schemas.CodeLLMUnavailable, "model endpoint: %s", clip(err.Error(), 200))
	}
	if len(res.Choices) == 0 {
		return nil, schemas.Errorf(schemas.CodeLLMBadResponse, "model answer has no choices")
	}
	msg := res.Choices[0].Message
	a = &answer{text: msg.Content, tokensIn: res.Usage.PromptTokens, tokensOut: res.Usage.CompletionTokens}
	for _, c := range msg.ToolCalls {
		a.calls = append(a.calls, rawCall{id: c.ID, kind: c.Type, name: c.Function.Name, args: c.Function.Arguments})
	}
	if a.text == "" && len(a.calls) == 0 {
		if msg.Refusal != "" {
			return nil, schemas.Errorf(schemas.CodeLLMBadResponse, "model refused: %s", clip(msg.Refusal, 200))
		}
		return nil, schemas.Errorf(schemas.CodeLLMBadResponse, "model answer has neither text nor tool calls")
	}
	return a, nil
}

// functionName is the function name under which tool is offered: function
// names may not hold dots, tool names may ("github.create_issue").
func functionName(tool string) string { return strings.ReplaceAll(tool, ".", "__") }

// clip cuts s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// toolParam is the function definition of a tool with JSON Schema schema
// ("" is any object).
func toolParam(name, description string, schema json.RawMessage) (openai.ChatCompletionToolUnionParam, error) {
	params := map[string]any{"type": "object"}
	if len(schema) > 0 {
		params = nil
		if err := json.Unmarshal(schema, &params); err != nil {
			return openai.ChatCompletionToolUnionParam{}, fmt.Errorf("tool %s: input schema: %w", name, err)
		}
	}
	def := openai.FunctionDefinitionParam{Name: functionName(name), Parameters: params}
	if description != "" {
		def.Description = openai.String(description)
	}
	return openai.ChatCompletionFunctionTool(def), nil
}
