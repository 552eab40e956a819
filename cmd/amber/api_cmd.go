package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/internal/edge/apiproxy"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/stores/sqlmeta"
)

type apiOptions struct {
	addr, store, name, logFormat, logLevel string
	portDomain                             string
	nodeTokenFile                          string
	tlsCert, tlsKey, nodeCA                string
}

func newAPICmd(g *globalFlags) *cobra.Command {
	o := &apiOptions{}
	c := &cobra.Command{
		Use:   "api",
		Short: "Run a stateless API server in front of the nodes of a deployment on shared stores",
		Long: `Run an API-only server: no sandboxes, no failover claims, no data dir.
It reads the shared metadata store (nodes, sandbox and session rows, API
keys) and passes each call to a node agent (amber up --store …): a call
for a sandbox or a session to the node that runs it (503 while that node is
down and its sandboxes are restored elsewhere), a create to a live node that
takes new sandboxes and has room (templates cached preferred), anything else
to any live node. Run as many as you like behind one address (a Kubernetes
Deployment and Service: deploy/kubernetes/api-deployment.yaml).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error { return runAPI(cmd, o) },
	}
	f := c.Flags()
	f.StringVar(&o.addr, "addr", "127.0.0.1:7780", "listen address")
	f.StringVar(&o.store, "store", "", "the deployment's metadata store, postgres://… (default $AMBER_STORE)")
	f.StringVar(&o.name, "name", "", "this server's name in the X-Amber-Forwarded-By header (default: the host name)")
	f.StringVar(&o.portDomain, "port-domain", server.DefaultPortDomain, "the nodes' --port-domain: requests for <port>-<sandbox>.DOMAIN go to the node of that sandbox")
	f.StringVar(&o.nodeTokenFile, "node-token-file", os.Getenv("AMBER_NODE_TOKEN_FILE"), "the nodes' --node-token-file: calls forwarded to a node carry it (default $AMBER_NODE_TOKEN_FILE)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve over HTTPS with this PEM certificate (with --tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "the PEM private key of --tls-cert (mode 0600)")
	f.StringVar(&o.nodeCA, "node-ca", "", "forward to the nodes over HTTPS, verifying their --tls-cert against this PEM CA")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

func runAPI(cmd *cobra.Command, o *apiOptions) error {
	lg, err := newLogger(cmd, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if o.store == "" {
		o.store = os.Getenv("AMBER_STORE")
	}
	if !sqlmeta.IsPostgres(o.store) {
		return usageError{fmt.Errorf("--store %q: an API server fronts a deployment on shared stores; want postgres://… (the nodes' --store)", redactStore(o.store))}
	}
	if o.name == "" {
		o.name, _ = os.Hostname()
	}
	hop, err := nodeHop(o.nodeTokenFile)
	if err != nil {
		return err
	}
	serveTLS, peersTLS, err := nodeTLS(o.tlsCert, o.tlsKey, o.nodeCA)
	if err != nil {
		return err
	}
	hop.TLS = peersTLS
	m, err := sqlmeta.Open(o.store, sqlmeta.Options{})
	if err != nil {
		return err
	}
	defer m.Close()
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	scheme := "http://"
	if serveTLS != nil {
		ln, scheme = tls.NewListener(ln, serveTLS), "https://"
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{
		Handler:           apiproxy.New(apiproxy.Options{Meta: m, Name: o.name, Logger: lg, PortDomain: o.portDomain, Hop: hop}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    server.MaxHeaderBytes,
	}
	lg.Info("amber api is up", "addr", scheme+ln.Addr().String(), "store", redactStore(o.store), "name", o.name)
	return serve(ctx, srv, ln, lg)
}
