package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

func newSessionCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "session", Short: "Durable agent sessions: create, list, show, send events, follow the log"}

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sessions",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ss, err := cl.ListSessions(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, ss)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tSANDBOX\tCREATED\tREASON")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.Status, s.Sandbox, s.Created.Local().Format(time.DateTime), s.Reason)
			}
			return tw.Flush()
		},
	}

	show := &cobra.Command{
		Use:   "show SESSION",
		Short: "Show a session: status, sandbox, definition",
		Args:  exactArgs(1, "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			s, err := cl.GetSession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd, s)
		},
	}

	var typ, payload, evID string
	send := &cobra.Command{
		Use:   "send SESSION [TEXT] [--type T --payload JSON] [--id ID]",
		Short: "Send a user message (TEXT) or another client event (interrupt, tool_confirmation, custom_tool_result, resume, terminate)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.PostSessionEventRequest{Type: typ, ID: evID}
			switch {
			case len(args) == 2 && payload == "":
				b, _ := json.Marshal(map[string]string{"text": args[1]})
				req.Payload = b
				if req.Type == "" {
					req.Type = "user_message"
				}
			case len(args) == 1 && payload != "":
				if !json.Valid([]byte(payload)) {
					return usageError{fmt.Errorf("--payload is not JSON")}
				}
				req.Payload = json.RawMessage(payload)
			case len(args) == 1 && typ != "":
			default:
				return usageError{errors.New("give TEXT (a user message) or --type and --payload")}
			}
			if req.Type == "" {
				return usageError{errors.New("--type is needed with --payload")}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			ev, err := cl.PostSessionEvent(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, ev)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d %s\n", ev.Seq, ev.Type)
			return nil
		},
	}
	send.Flags().StringVar(&typ, "type", "", "event type (default user_message)")
	send.Flags().StringVar(&payload, "payload", "", "event payload as JSON")
	send.Flags().StringVar(&evID, "id", "", "idempotency id: the same id and content are appended once")

	c.AddCommand(newSessionCreateCmd(g), ls, show, send, newSessionEventsCmd(g))
	return c
}

// newSessionCreateCmd is amber session create.
func newSessionCreateCmd(g *globalFlags) *cobra.Command {
	var file, model, modelName, provider, baseURL, keySecret, script, template, policy, system string
	var maxTurns, maxTokens int
	var maxWall time.Duration
	create := &cobra.Command{
		Use:   "create [-f DEFINITION.json] [--model scripted|anthropic|openai] [--script TURNS.json] [flags]",
		Short: "Create a session and print its id",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			def := map[string]any{}
			if file != "" {
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &def); err != nil {
					return usageError{fmt.Errorf("%s: %v", file, err)}
				}
			}
			m, _ := def["model"].(map[string]any)
			if m == nil {
				m = map[string]any{}
			}
			set := func(dst map[string]any, k string, v any, on bool) {
				if on {
					dst[k] = v
				}
			}
			set(m, "adapter", model, model != "")
			set(m, "name", modelName, modelName != "")
			set(m, "provider", provider, provider != "")
			set(m, "base_url", baseURL, baseURL != "")
			set(m, "api_key_secret", keySecret, keySecret != "")
			if script != "" {
				b, err := os.ReadFile(script)
				if err != nil {
					return err
				}
				var turns any
				if err := json.Unmarshal(b, &turns); err != nil {
					return usageError{fmt.Errorf("%s: %v", script, err)}
				}
				m["script"] = turns
			}
			def["model"] = m
			set(def, "template", template, template != "")
			set(def, "policy", policy, policy != "")
			set(def, "system", system, system != "")
			lim, _ := def["limits"].(map[string]any)
			if lim == nil {
				lim = map[string]any{}
			}
			set(lim, "max_turns", maxTurns, maxTurns > 0)
			set(lim, "max_tokens", maxTokens, maxTokens > 0)
			set(lim, "max_wall_ns", maxWall.Nanoseconds(), maxWall > 0)
			if len(lim) > 0 {
				def["limits"] = lim
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			s, err := cl.CreateSession(cmd.Context(), def)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, s)
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return nil
		},
	}
	f := create.Flags()
	f.StringVarP(&file, "file", "f", "", "the session definition as JSON (flags override its fields)")
	f.StringVar(&model, "model", "", "model adapter: scripted, anthropic or openai")
	f.StringVar(&modelName, "model-name", "", "the model's name at the provider")
	f.StringVar(&provider, "provider", "", "a model provider the operator configured (amber up --model-provider) and offers your tenant")
	f.StringVar(&baseURL, "base-url", "", "your own model API's base URL (dialled through the egress deny list; sent no key of the operator's)")
	f.StringVar(&keySecret, "api-key-secret", "", "your tenant's secret (amber secret set) holding the API key; it must be bound to the endpoint's host")
	f.StringVar(&script, "script", "", "the scripted model's turns (a JSON array)")
	f.StringVar(&template, "template", "", "sandbox template (default python)")
	f.StringVar(&policy, "policy", "", "recovery policy: strict (default) or fast")
	f.StringVar(&system, "system", "", "system prompt")
	f.IntVar(&maxTurns, "max-turns", 0, "pause after this many model calls")
	f.IntVar(&maxTokens, "max-tokens", 0, "pause after this many tokens")
	f.DurationVar(&maxWall, "max-wall", 0, "pause after this long")
	return create
}

// newSessionEventsCmd is amber session events.
func newSessionEventsCmd(g *globalFlags) *cobra.Command {
	var after uint64
	var follow bool
	var until string
	events := &cobra.Command{
		Use:   "events SESSION [--after N] [--follow [--until STATUS]]",
		Short: "Print a session's events; --follow streams them (Server-Sent Events), reconnecting and resuming after the last one seen",
		Args:  exactArgs(1, "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			id := args[0]
			print := func(ev api.Event) error {
				if g.json {
					if err := printJSON(cmd, ev); err != nil {
						return err
					}
				} else {
					fmt.Fprintln(cmd.OutOrStdout(), summarizeEvent(ev))
				}
				if until != "" && ev.Type == "session.status" {
					var st struct {
						Status string `json:"status"`
					}
					json.Unmarshal(ev.Payload, &st)
					if st.Status == until {
						return errUntil
					}
				}
				return nil
			}
			if !follow {
				for {
					l, err := cl.SessionEvents(cmd.Context(), id, after, 1000)
					if err != nil {
						return err
					}
					for _, ev := range l.Events {
						if err := print(ev); err != nil {
							return nilIfUntil(err)
						}
					}
					if len(l.Events) < 1000 {
						return nil
					}
					after = l.Next - 1
				}
			}
			// Follow: reconnect on any break (a daemon restart) and resume
			// after the last event printed.
			for {
				last, err := cl.StreamSessionEvents(cmd.Context(), id, after, false, print)
				after = last
				if errors.Is(err, errUntil) || cmd.Context().Err() != nil {
					return nil
				}
				// An answer (not found, …) ends; a broken connection or an
				// unavailable daemon is retried.
				var ce *client.Error
				if errors.As(err, &ce) && ce.Kind != "unavailable" {
					return err
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(300 * time.Millisecond):
				}
			}
		},
	}
	events.Flags().Uint64Var(&after, "after", 0, "print the events after this sequence number")
	events.Flags().BoolVar(&follow, "follow", false, "stream new events as they are appended")
	events.Flags().StringVar(&until, "until", "", "with --follow: exit once the session reaches this status (e.g. idle)")
	return events
}

var errUntil = errors.New("status reached")

func nilIfUntil(err error) error {
	if errors.Is(err, errUntil) {
		return nil
	}
	return err
}

// summarizeEvent is one line about ev for people.
func summarizeEvent(ev api.Event) string {
	var p map[string]any
	json.Unmarshal(ev.Payload, &p)
	short := func(v any) string {
		s := fmt.Sprint(v)
		s = strings.ReplaceAll(s, "\n", "⏎")
		if len(s) > 100 {
			s = s[:100] + "…"
		}
		return s
	}
	what := ""
	switch strings.TrimPrefix(ev.Type, "session.") {
	case "user_message", "assistant_message":
		what = short(p["text"])
		if tc, ok := p["tool_calls"].([]any); ok && len(tc) > 0 {
			what += fmt.Sprintf(" [%d tool calls]", len(tc))
		}
	case "status":
		what = short(p["status"])
		if r, ok := p["reason"]; ok {
			what += " (" + short(r) + ")"
		}
	case "tool_call":
		b, _ := json.Marshal(p["input"])
		what = fmt.Sprintf("%v %v %s", p["id"], p["name"], short(string(b)))
	case "tool_result":
		what = fmt.Sprintf("%v %v: %s", p["tool_call_id"], p["name"], short(p["output"]))
	default:
		b, _ := json.Marshal(p)
		what = short(string(b))
	}
	return fmt.Sprintf("%d\t%s\t%s", ev.Seq, ev.Type, what)
}
