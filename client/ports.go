package client

import (
	"context"
	"strconv"

	"github.com/amber-run/amber/api"
)

// ExposePort makes port of sandbox id reachable at the returned URL, which
// proxies HTTP and WebSocket to 127.0.0.1:port inside the sandbox. The URL
// carries a secret token and needs no API key; the daemon shows it only
// here. Exposing a port again replaces its token.
func (c *Client) ExposePort(ctx context.Context, id string, port int) (api.PortExposure, error) {
	var out api.PortExposure
	return out, c.do(ctx, "POST", sbPath(id, "/ports"), nil, api.ExposePortRequest{Port: port}, &out)
}

// Ports lists the exposed ports of sandbox id (without their tokens).
func (c *Client) Ports(ctx context.Context, id string) ([]api.PortExposure, error) {
	var out api.PortList
	return out.Ports, c.do(ctx, "GET", sbPath(id, "/ports"), nil, nil, &out)
}

// UnexposePort stops exposing port of sandbox id; its URL answers 404.
func (c *Client) UnexposePort(ctx context.Context, id string, port int) error {
	return c.do(ctx, "DELETE", sbPath(id, "/ports/"+strconv.Itoa(port)), nil, nil, nil)
}
