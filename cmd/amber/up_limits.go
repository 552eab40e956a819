package main

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/edge/server"
)

// edgeOptions are `amber up`'s flags for exposed ports' origins and the
// bounds the API puts on sandboxes and streams.
type edgeOptions struct {
	portDomain                  string
	maxMemory, maxCPUs, maxDisk string
	maxPids                     int64
	maxStreams                  int
	bodyReadTimeout             time.Duration
	e2b                         bool

	domain string         // checked --port-domain
	max    sandbox.Limits // checked maxima
}

func (o *edgeOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.portDomain, "port-domain", server.DefaultPortDomain, "domain of exposed ports' own origins: a port is served at <port>-<sandbox>.DOMAIN (point the wildcard *.DOMAIN at the daemon; the default resolves to loopback in browsers); never the API's own host or a parent of it")
	f.BoolVar(&o.e2b, "e2b", false, "serve E2B's control plane at /e2b (E2B_API_URL=http://ADDR/e2b; the e2b SDK's envd is served always: README, E2B)")
	f.StringVar(&o.maxMemory, "max-sandbox-memory", "", "the most memory a sandbox may ask for, e.g. 8Gi (default: this node's memory)")
	f.StringVar(&o.maxCPUs, "max-sandbox-cpus", "", "the most CPUs a sandbox may ask for, e.g. 4 or 500m (default: this node's CPUs)")
	f.StringVar(&o.maxDisk, "max-sandbox-disk", "256Gi", "the most disk (writable layer) a sandbox may ask for")
	f.Int64Var(&o.maxPids, "max-sandbox-pids", 32768, "the most processes a sandbox may ask for")
	f.IntVar(&o.maxStreams, "max-streams-per-tenant", server.DefaultLimits.MaxStreamsPerTenant, "long-lived streams (followed events, session SSE, exec, process waits, terminals) one tenant may hold open at once on this node; one more is a 429")
	f.DurationVar(&o.bodyReadTimeout, "body-read-timeout", server.DefaultLimits.BodyReadTimeout, "the longest a request body (an upload, a JSON body) may pause before its next bytes; a stalled one is a 400 and its connection is closed (an exec's streamed stdin is not timed)")
}

// check reads and checks the flags, before the daemon starts anything
// (addr is its listen address, which the port domain must not cover).
func (o *edgeOptions) check(addr string) error {
	d := strings.Trim(strings.ToLower(o.portDomain), ".")
	if err := checkPortDomain(d); err != nil {
		return usageError{fmt.Errorf("--port-domain %q: %v", o.portDomain, err)}
	}
	if h, _, err := net.SplitHostPort(addr); err == nil && (h == d || strings.HasSuffix(h, "."+d)) {
		return usageError{fmt.Errorf("--port-domain %q covers the API's own host %s: ports need a domain of their own", o.portDomain, h)}
	}
	o.domain = d
	l := server.DefaultMaxSandbox()
	var err error
	if o.maxMemory != "" {
		if l.MemoryBytes, err = parseSize(o.maxMemory); err != nil {
			return usageError{fmt.Errorf("--max-sandbox-memory: %v", err)}
		}
	}
	if o.maxCPUs != "" {
		if l.MilliCPUs, err = parseCPUs(o.maxCPUs); err != nil {
			return usageError{fmt.Errorf("--max-sandbox-cpus: %v", err)}
		}
	}
	if l.DiskBytes, err = parseSize(o.maxDisk); err != nil {
		return usageError{fmt.Errorf("--max-sandbox-disk: %v", err)}
	}
	if o.maxPids < 8 {
		return usageError{fmt.Errorf("--max-sandbox-pids %d: at least 8", o.maxPids)}
	}
	l.Pids = o.maxPids
	if o.maxStreams < 1 {
		return usageError{fmt.Errorf("--max-streams-per-tenant %d: at least 1", o.maxStreams)}
	}
	if o.bodyReadTimeout < time.Second {
		return usageError{fmt.Errorf("--body-read-timeout %s: at least 1s", o.bodyReadTimeout)}
	}
	o.max = l
	return nil
}

// apply sets the checked flags in the API server's options.
func (o *edgeOptions) apply(so *server.Options) {
	so.PortDomain = o.domain
	so.E2B = o.e2b
	so.Limits.MaxSandbox = o.max
	so.Limits.MaxStreamsPerTenant = o.maxStreams
	so.Limits.BodyReadTimeout = o.bodyReadTimeout
}

// checkPortDomain accepts a DNS name of at least two labels of letters,
// digits and hyphens (not an IP address: host names are built under it).
func checkPortDomain(d string) error {
	if net.ParseIP(d) != nil {
		return fmt.Errorf("an IP address cannot have names under it; use a domain (default %s)", server.DefaultPortDomain)
	}
	labels := strings.Split(d, ".")
	if len(labels) < 2 || len(d) > 180 {
		return fmt.Errorf("want a domain of two labels or more, like %s or ports.example.com", server.DefaultPortDomain)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q is not a DNS label", l)
		}
	}
	return nil
}
