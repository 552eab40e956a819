package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/internal/session"
)

// modelOptions are `amber up`'s model providers: the only way a key of the
// operator's reaches a model API (a tenant never names the daemon's
// environment; see internal/session.Provider).
type modelOptions struct {
	providers []string
}

const modelProvidersHelp = `

Model providers (agent sessions): --model-provider ` + session.ProviderSyntax + `
configures a model API the operator offers (repeatable), e.g.

  --model-provider claude=https://api.anthropic.com,key-env=ANTHROPIC_API_KEY,adapter=anthropic,tenants=acme|globex
  --model-provider local=http://127.0.0.1:8000/v1,adapter=openai,tenants=*

A tenant picks one by name (model.provider in the session definition). The
operator's key is read from the variable key-env names, at start (unset or
empty: the daemon does not start), and is sent only to that URL and only
for the tenants listed (tenants=*: every tenant; without tenants=: only the
operator's tenant, default). A tenant may instead bring its own key as a
secret (model.api_key_secret) bound to the provider's host. The provider's
URL is the operator's, so it is dialled without the egress deny list; a
URL a tenant chooses (model.base_url) is dialled through it and is never
sent a key of the operator's. Nothing else reads the daemon's environment
for a model: ANTHROPIC_API_KEY or OPENAI_API_KEY alone is used by no session.
With shared stores, give every node the same providers: a session runs on
the node of its sandbox, and one woken where its provider is not offered is
refused (a session.error event; it waits).`

// register adds the flag to c and its manual to c's long help.
func (o *modelOptions) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&o.providers, "model-provider", nil, "a model provider tenants' sessions may use: "+session.ProviderSyntax+" (repeatable; see below)")
	c.Long += modelProvidersHelp
}

// parse reads the providers, their keys from the daemon's environment.
func (o *modelOptions) parse() (map[string]session.Provider, error) {
	out := map[string]session.Provider{}
	for _, spec := range o.providers {
		p, err := session.ParseProvider(spec, os.Getenv)
		if err != nil {
			return nil, usageError{err}
		}
		if _, dup := out[p.Name]; dup {
			return nil, usageError{fmt.Errorf("--model-provider %s is given twice", p.Name)}
		}
		out[p.Name] = p
	}
	return out, nil
}
