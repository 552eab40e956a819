package api

// Info is the body of GET /v1/info.
type Info struct {
	Version      string          `json:"version"`
	Driver       string          `json:"driver"`
	Capabilities map[string]bool `json:"capabilities"`
	Tenant       string          `json:"tenant"` // the caller's
	// Key and Scopes: the calling key's name and scopes.
	Key    string   `json:"key"`
	Scopes []string `json:"scopes"`
}
