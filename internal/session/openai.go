package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// OpenAI is the adapter for OpenAI-compatible Chat Completions APIs
// (streaming, tool calls), on the official Go SDK. The SDK retries 408,
// 409, 429 and 5xx answers itself, honouring retry-after; a stream cut
// after it began is re-issued here, up to the same number of retries.
type OpenAI struct {
	completions openai.ChatCompletionService
	retries     int
}

// NewOpenAI returns an adapter for baseURL ("" for the API's public URL)
// with apiKey, dialling through hc (nil: through the egress deny list, as
// for a URL a tenant chose); retries <= 0 means 4. Nothing is read from the
// daemon's environment: the chat completions service is made without the
// client's OPENAI_* defaults.
func NewOpenAI(baseURL, apiKey string, retries int, hc *http.Client) *OpenAI {
	if retries <= 0 {
		retries = 4
	}
	if hc == nil {
		hc = guardedClient()
	}
	opts := []option.RequestOption{option.WithHTTPClient(hc), option.WithEnvironmentProduction(),
		option.WithAPIKey(apiKey), option.WithMaxRetries(retries)}
	if baseURL != "" {
		opts = append(opts, option.WithBaseURL(baseURL))
	}
	return &OpenAI{completions: openai.NewChatCompletionService(opts...), retries: retries}
}

// params maps a Request to Chat Completions parameters.
func (o *OpenAI) params(req Request) openai.ChatCompletionNewParams {
	params := openai.ChatCompletionNewParams{
		Model:         shared.ChatModel(req.Model),
		Messages:      openaiMessages(req.System, req.Messages),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	if req.MaxTokens > 0 {
		params.MaxCompletionTokens = openai.Int(int64(req.MaxTokens))
	}
	for _, t := range req.Tools {
		var schema map[string]any
		_ = json.Unmarshal(t.InputSchema, &schema)
		fd := shared.FunctionDefinitionParam{Name: t.Name, Parameters: shared.FunctionParameters(schema)}
		if t.Description != "" {
			fd.Description = openai.String(t.Description)
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(fd))
	}
	return params
}

// Complete implements Model.
func (o *OpenAI) Complete(ctx context.Context, req Request, onDelta func(string)) (Response, error) {
	params := o.params(req)
	ctx, refused, done := withStop(ctx)
	defer done()
	var err error
	for attempt := 0; attempt <= o.retries; attempt++ {
		var resp Response
		if resp, err = o.once(ctx, params, onDelta); err == nil {
			return resp, nil
		}
		if r := refused(); r != nil {
			return Response{}, fmt.Errorf("openai: %w", r)
		}
		var apiErr *openai.Error
		if ctx.Err() != nil || (errors.As(err, &apiErr) && !retryable(apiErr.StatusCode)) {
			break
		}
		select {
		case <-ctx.Done():
			return Response{}, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return Response{}, fmt.Errorf("openai: %w", err)
}

func (o *OpenAI) once(ctx context.Context, params openai.ChatCompletionNewParams, onDelta func(string)) (Response, error) {
	stream := o.completions.NewStreaming(ctx, params)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	finished := false
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		for _, c := range ch.Choices {
			if c.Delta.Content != "" && onDelta != nil {
				onDelta(c.Delta.Content)
			}
			if c.FinishReason != "" {
				finished = true
			}
		}
	}
	if err := stream.Err(); err != nil {
		return Response{}, err
	}
	if !finished || len(acc.Choices) == 0 {
		return Response{}, errors.New("stream ended without a finish reason")
	}
	ch := acc.Choices[0]
	r := Response{Text: ch.Message.Content, StopReason: ch.FinishReason,
		Usage: Usage{InputTokens: int(acc.Usage.PromptTokens), OutputTokens: int(acc.Usage.CompletionTokens)}}
	for _, tc := range ch.Message.ToolCalls {
		args := tc.Function.Arguments
		if args == "" {
			args = "{}"
		}
		if !json.Valid([]byte(args)) {
			return Response{}, fmt.Errorf("tool call %s: arguments are not JSON: %.100q", tc.ID, args)
		}
		r.ToolCalls = append(r.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Input: json.RawMessage(args)})
	}
	return r, nil
}

// openaiMessages maps the conversation: the system prompt first, tool
// results as tool messages.
func openaiMessages(system string, msgs []Message) []openai.ChatCompletionMessageParamUnion {
	var out []openai.ChatCompletionMessageParamUnion
	if system != "" {
		out = append(out, openai.SystemMessage(system))
	}
	for _, m := range msgs {
		switch m.Role {
		case "user":
			out = append(out, openai.UserMessage(m.Text))
		case "tool":
			out = append(out, openai.ToolMessage(m.Text, m.ToolCallID))
		case "assistant":
			a := openai.ChatCompletionAssistantMessageParam{}
			if m.Text != "" {
				a.Content.OfString = openai.String(m.Text)
			}
			for _, c := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: c.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: string(c.Input)}}})
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		}
	}
	return out
}
