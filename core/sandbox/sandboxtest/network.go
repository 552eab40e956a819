package sandboxtest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// testNetwork: from inside a sandbox, no TCP connection reaches a server
// the test runs on the host (on 127.0.0.1 or on a host address), the
// link-local metadata address, or a server in another sandbox; a server
// and a client inside one sandbox talk. Each host server first answers the
// test itself, so a refused connection means isolation, not a dead server.
func (s *suite) testNetwork(t *testing.T) {
	a := s.create(t, "net-a", sandbox.Limits{})
	b := s.create(t, "net-b", sandbox.Limits{})
	token := randToken("HOST-SERVICE")

	var targets []string
	serve := func(addr string) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("cannot listen on %s: %v", addr, err)
			return
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, token) }), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		url := "http://" + ln.Addr().String() + "/"
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("the host server %s does not answer the host: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != token {
			t.Fatalf("host server %s answered %q", url, body)
		}
		targets = append(targets, ln.Addr().String())
	}
	serve("127.0.0.1:0")
	if ip := hostAddress(); ip != "" {
		serve(net.JoinHostPort(ip, "0"))
	} else {
		t.Logf("the host has no non-loopback IPv4 address; only loopback is tried")
	}
	serve("[::1]:0")
	targets = append(targets, "169.254.169.254:80", "169.254.169.254:8080")

	fetch := func(id, hostport string) result {
		// Not wget -T: busybox's wget crashes with it under gVisor.
		return s.shStatus(t, id, fmt.Sprintf("timeout 5 wget -q -O - http://%s/ 2>&1; echo rc=$?", hostport))
	}
	// The metadata address is only ever tried from inside the sandbox: the
	// test itself sends no traffic to any address off this machine.
	for _, target := range targets {
		r := fetch(a, target)
		if strings.Contains(r.Stdout, token) {
			t.Errorf("sandbox reached the host service at %s: %q", target, r.Stdout)
		} else if connected(r.Stdout) {
			t.Errorf("sandbox connected to %s: %q", target, r.Stdout)
		} else {
			t.Logf("%s from the sandbox: %s", target, strings.TrimSpace(r.Stdout))
		}
	}

	// A server inside b; it answers b itself.
	sbxToken := randToken("SANDBOX-B")
	s.sh(t, b, "mkdir -p /www && echo "+sbxToken+" > /www/index.html")
	if _, err := s.d.Start(ctxFor(t, callTimeout), b, sandbox.ExecSpec{Args: []string{"httpd", "-f", "-p", "8080", "-h", "/www"}}); err != nil {
		t.Fatalf("Start httpd in b: %v", err)
	}
	eventually(t, 20*time.Second, func() string {
		if r := fetch(b, "127.0.0.1:8080"); !strings.Contains(r.Stdout, sbxToken) {
			return "the server in b does not answer b: " + r.Stdout
		}
		return ""
	})
	bAddrs := []string{"127.0.0.1"}
	for _, f := range strings.Fields(s.sh(t, b, "ip -o -4 addr show 2>/dev/null | awk '{print $4}' | cut -d/ -f1; true")) {
		if !strings.HasPrefix(f, "127.") {
			bAddrs = append(bAddrs, f)
		}
	}
	for _, ip := range bAddrs {
		if r := fetch(a, net.JoinHostPort(ip, "8080")); strings.Contains(r.Stdout, sbxToken) || connected(r.Stdout) {
			t.Errorf("sandbox a reached sandbox b's server at %s: %q", ip, r.Stdout)
		}
	}
	if out := s.sh(t, a, "ip -o link show 2>/dev/null | awk -F': ' '{print $2}'"); strings.TrimSpace(out) != "" && strings.TrimSpace(out) != "lo" {
		t.Logf("interfaces in the sandbox: %q", out)
	}
	if out := s.sh(t, a, "ip route show 2>/dev/null; ip -6 route show 2>/dev/null | grep -v '^::1' | grep -v '^fe80' ; true"); strings.Contains(out, "default") {
		t.Errorf("the sandbox has a default route: %q", out)
	}

	// Inside one sandbox, TCP works.
	aToken := randToken("SANDBOX-A")
	s.sh(t, a, "mkdir -p /www && echo "+aToken+" > /www/index.html")
	if _, err := s.d.Start(ctxFor(t, callTimeout), a, sandbox.ExecSpec{Args: []string{"httpd", "-f", "-p", "127.0.0.1:8081", "-h", "/www"}}); err != nil {
		t.Fatalf("Start httpd in a: %v", err)
	}
	eventually(t, 20*time.Second, func() string {
		if r := fetch(a, "127.0.0.1:8081"); !strings.Contains(r.Stdout, aToken) {
			return "TCP inside one sandbox does not work: " + r.Stdout
		}
		return ""
	})
}

// connected reports whether wget's output shows that a TCP connection was
// made (it succeeded, or a server answered with an HTTP error).
func connected(out string) bool {
	return strings.Contains(out, "rc=0") || strings.Contains(out, "server returned") || strings.Contains(out, "HTTP/")
}

// hostAddress returns an IPv4 address of an up, non-loopback host
// interface, or "".
func hostAddress() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	return ""
}
