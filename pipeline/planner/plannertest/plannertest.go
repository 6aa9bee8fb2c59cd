// Package plannertest is a scripted model for tests: a real HTTP server on
// 127.0.0.1 that speaks the OpenAI chat-completions wire format
// (POST /chat/completions), answers each conversation from a script, and
// records every request it receives.
//
// A conversation is named by its current user text: the last "user"
// message of a request. Step n of a conversation is the request with n
// assistant messages after that user message, and is answered with the
// script's n-th Reply. The answer to a step depends only on the step, so a
// planner that asks a step again (after a crash) gets the same answer.
package plannertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// Call is a tool call in a scripted answer, or in a recorded request's
// assistant message (with its ID).
type Call struct {
	ID   string `json:"id,omitempty"`
	Name string `json:"name"`
	Args string `json:"arguments"`
}

// Reply is the scripted answer to one step.
type Reply struct {
	Text  string
	Calls []Call
	// Status: HTTP error statuses answered first, one per attempt of the
	// step, before the answer (e.g. 429, then the answer).
	Status []int
	// Raw, if set, is the body answered (status 200) instead of a
	// completion: garbage, for the bad-response path.
	Raw string
	// PromptTokens and CompletionTokens are the usage reported (default
	// 10 and 5).
	PromptTokens, CompletionTokens int64
}

// Message is a message of a recorded request.
type Message struct {
	Role       string
	Content    string
	ToolCallID string
	ToolCalls  []Call
}

// Tool is a function offered in a recorded request.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Request is a recorded request.
type Request struct {
	Model        string
	Messages     []Message
	Tools        []Tool
	Conversation string // the current user text
	Step         int
	Status       int       // what the server answered
	At           time.Time // when the request arrived
}

// ToolNames returns the names of the offered functions.
func (r Request) ToolNames() []string {
	var out []string
	for _, t := range r.Tools {
		out = append(out, t.Name)
	}
	return out
}

// ToolResults returns the content of the request's tool messages, in
// order.
func (r Request) ToolResults() []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "tool" {
			out = append(out, m.Content)
		}
	}
	return out
}

// Server is the scripted model.
type Server struct {
	URL string // the API root, for planner.ModelConfig.BaseURL

	hs       *httptest.Server
	mu       sync.Mutex
	scripts  map[string][]Reply
	attempts map[string]int // per conversation and step
	requests []Request
	// answered, if set, is called after each answer is written.
	answered func(Request)
}

// New starts a server that stops when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatalf("plannertest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start starts a server outside a test (a benchmark or chaos harness);
// Close stops it.
func Start() (*Server, error) {
	s := &Server{scripts: map[string][]Reply{}, attempts: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.hs = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.hs.Listener = ln
	s.hs.Start()
	s.URL = s.hs.URL + "/v1"
	return s, nil
}

// Close stops the server.
func (s *Server) Close() { s.hs.Close() }

// Script sets the answers of the conversation whose user text is text.
func (s *Server) Script(text string, replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[text] = replies
}

// OnAnswer sets a function called after each answer is written (e.g. to
// stop a planner between the model's answer and what it does with it).
func (s *Server) OnAnswer(f func(Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered = f
}

// Requests returns the requests of the conversation text ("" for all),
// in arrival order.
func (s *Server) Requests(text string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if text == "" {
		return slices.Clone(s.requests)
	}
	var out []Request
	for _, r := range s.requests {
		if r.Conversation == text {
			out = append(out, r)
		}
	}
	return out
}

// wire is the part of a chat-completions request the server reads.
type wire struct {
	Model    string `json:"model"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function Call   `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		httpError(w, http.StatusNotFound, "no such endpoint "+r.URL.Path)
		return
	}
	arrived := time.Now()
	body, _ := io.ReadAll(r.Body)
	var in wire
	if err := json.Unmarshal(body, &in); err != nil {
		httpError(w, http.StatusBadRequest, "request is not JSON: "+err.Error())
		return
	}
	req := Request{Model: in.Model, At: arrived}
	for _, m := range in.Messages {
		msg := Message{Role: m.Role, ToolCallID: m.ToolCallID}
		if err := json.Unmarshal(m.Content, &msg.Content); err != nil && len(m.Content) > 0 {
			msg.Content = string(m.Content) // an array of parts: kept as JSON
		}
		for _, c := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, Call{ID: c.ID, Name: c.Function.Name, Args: c.Function.Args})
		}
		req.Messages = append(req.Messages, msg)
		switch m.Role {
		case "user":
			req.Conversation, req.Step = msg.Content, 0
		case "assistant":
			req.Step++
		}
	}
	for _, t := range in.Tools {
		req.Tools = append(req.Tools, Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}

	s.mu.Lock()
	script, ok := s.scripts[req.Conversation]
	key := fmt.Sprintf("%s\x00%d", req.Conversation, req.Step)
	attempt := s.attempts[key]
	s.attempts[key]++
	s.mu.Unlock()

	status, answer := http.StatusOK, ""
	switch {
	case !ok || req.Step >= len(script):
		status, answer = http.StatusBadRequest, errorBody(fmt.Sprintf("no scripted answer for step %d of %q", req.Step, req.Conversation))
	case attempt < len(script[req.Step].Status):
		status = script[req.Step].Status[attempt]
		answer = errorBody(fmt.Sprintf("scripted status %d", status))
	case script[req.Step].Raw != "":
		answer = script[req.Step].Raw
	default:
		answer = completion(req.Step, script[req.Step])
	}
	req.Status = status

	s.mu.Lock()
	s.requests = append(s.requests, req)
	after := s.answered
	s.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After-Ms", "10")
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, answer)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	if after != nil {
		after(req)
	}
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, errorBody(msg))
}

func errorBody(msg string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "scripted", "code": nil, "param": nil}})
	return string(b)
}

// completion is the chat-completions answer of reply to step step.
func completion(step int, reply Reply) string {
	type fn struct {
		Name string `json:"name"`
		Args string `json:"arguments"`
	}
	type toolCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	msg := map[string]any{"role": "assistant", "content": reply.Text}
	finish := "stop"
	if len(reply.Calls) > 0 {
		var calls []toolCall
		for i, c := range reply.Calls {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("call_%d_%d", step, i)
			}
			calls = append(calls, toolCall{ID: id, Type: "function", Function: fn{Name: c.Name, Args: c.Args}})
		}
		msg["tool_calls"] = calls
		finish = "tool_calls"
	}
	in, out := reply.PromptTokens, reply.CompletionTokens
	if in == 0 && out == 0 {
		in, out = 10, 5
	}
	b, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", step), "object": "chat.completion", "created": 0, "model": "scripted",
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": msg}},
		"usage":   map[string]any{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out},
	})
	return string(b)
}
