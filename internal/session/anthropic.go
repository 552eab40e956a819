package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// Anthropic is the adapter for the Anthropic Messages API (streaming, tool
// use), on the official Go SDK. The SDK retries 408, 409, 429 and 5xx
// (529 "overloaded" included) answers itself, honouring retry-after; a
// stream cut by an error event after it began is re-issued here, up to the
// same number of retries.
type Anthropic struct {
	client  anthropic.Client
	retries int
}

// NewAnthropic returns an adapter for baseURL ("" for the API's public
// URL) with apiKey, dialling through hc (nil: through the egress deny list,
// as for a URL a tenant chose); retries <= 0 means 4. Nothing is read from
// the daemon's environment (the SDK's ANTHROPIC_* defaults are off).
func NewAnthropic(baseURL, apiKey string, retries int, hc *http.Client) *Anthropic {
	if retries <= 0 {
		retries = 4
	}
	if hc == nil {
		hc = guardedClient()
	}
	opts := []option.RequestOption{option.WithoutEnvironmentDefaults(), option.WithHTTPClient(hc),
		option.WithAPIKey(apiKey), option.WithMaxRetries(retries)}
	if baseURL != "" {
		opts = append(opts, option.WithBaseURL(baseURL))
	}
	return &Anthropic{client: anthropic.NewClient(opts...), retries: retries}
}

// params maps a Request to the Messages API's parameters.
func (a *Anthropic) params(req Request) anthropic.MessageNewParams {
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(req.Model),
		MaxTokens: int64(req.MaxTokens),
		Messages:  anthropicMessages(req.Messages),
	}
	if req.System != "" {
		params.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	for _, t := range req.Tools {
		var schema struct {
			Properties any      `json:"properties"`
			Required   []string `json:"required"`
		}
		_ = json.Unmarshal(t.InputSchema, &schema)
		tp := anthropic.ToolParam{Name: t.Name, InputSchema: anthropic.ToolInputSchemaParam{Properties: schema.Properties, Required: schema.Required}}
		if t.Description != "" {
			tp.Description = anthropic.String(t.Description)
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: &tp})
	}
	return params
}

// Complete implements Model.
func (a *Anthropic) Complete(ctx context.Context, req Request, onDelta func(string)) (Response, error) {
	params := a.params(req)
	ctx, refused, done := withStop(ctx)
	defer done()
	var err error
	for attempt := 0; attempt <= a.retries; attempt++ {
		var resp Response
		if resp, err = a.once(ctx, params, onDelta); err == nil {
			return resp, nil
		}
		if r := refused(); r != nil {
			return Response{}, fmt.Errorf("anthropic: %w", r)
		}
		var apiErr *anthropic.Error
		if ctx.Err() != nil || (errors.As(err, &apiErr) && !retryable(apiErr.StatusCode)) {
			break
		}
		select {
		case <-ctx.Done():
			return Response{}, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return Response{}, fmt.Errorf("anthropic: %w", err)
}

func (a *Anthropic) once(ctx context.Context, params anthropic.MessageNewParams, onDelta func(string)) (Response, error) {
	stream := a.client.Messages.NewStreaming(ctx, params)
	defer stream.Close()
	var msg anthropic.Message
	stopped := false
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			return Response{}, err
		}
		if ev.Type == "content_block_delta" && ev.Delta.Type == "text_delta" && onDelta != nil {
			onDelta(ev.Delta.Text)
		}
		if ev.Type == "message_stop" {
			stopped = true
		}
	}
	if err := stream.Err(); err != nil {
		return Response{}, err
	}
	if !stopped {
		return Response{}, errors.New("stream ended before message_stop")
	}
	r := Response{StopReason: string(msg.StopReason),
		Usage: Usage{InputTokens: int(msg.Usage.InputTokens), OutputTokens: int(msg.Usage.OutputTokens)}}
	for _, b := range msg.Content {
		switch b.Type {
		case "text":
			r.Text += b.Text
		case "tool_use":
			in := b.Input
			if len(in) == 0 {
				in = json.RawMessage(`{}`)
			}
			r.ToolCalls = append(r.ToolCalls, ToolCall{ID: b.ID, Name: b.Name, Input: append(json.RawMessage(nil), in...)})
		}
	}
	return r, nil
}

// anthropicMessages maps the conversation: tool results become tool_result
// blocks of a user message, and consecutive messages of one role merge.
func anthropicMessages(msgs []Message) []anthropic.MessageParam {
	type group struct {
		user   bool
		blocks []anthropic.ContentBlockParamUnion
	}
	var gs []group
	add := func(user bool, blocks ...anthropic.ContentBlockParamUnion) {
		if n := len(gs); n > 0 && gs[n-1].user == user {
			gs[n-1].blocks = append(gs[n-1].blocks, blocks...)
			return
		}
		gs = append(gs, group{user, blocks})
	}
	for _, m := range msgs {
		switch m.Role {
		case "user":
			add(true, anthropic.NewTextBlock(m.Text))
		case "tool":
			add(true, anthropic.NewToolResultBlock(m.ToolCallID, m.Text, m.IsError))
		case "assistant":
			var blocks []anthropic.ContentBlockParamUnion
			if m.Text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Text))
			}
			for _, c := range m.ToolCalls {
				blocks = append(blocks, anthropic.NewToolUseBlock(c.ID, json.RawMessage(c.Input), c.Name))
			}
			if len(blocks) > 0 {
				add(false, blocks...)
			}
		}
	}
	out := make([]anthropic.MessageParam, 0, len(gs))
	for _, g := range gs {
		if g.user {
			out = append(out, anthropic.NewUserMessage(g.blocks...))
		} else {
			out = append(out, anthropic.NewAssistantMessage(g.blocks...))
		}
	}
	return out
}
