package gateway

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// FuzzMatchDest: matching ignores case and a trailing dot; a name pattern
// matches only the host whose normalised form is the pattern's; a
// "*.suffix" pattern only proper subdomains; an IP pattern only that
// address (never a zoned spelling of it); a port other than the pattern's
// never.
func FuzzMatchDest(f *testing.F) {
	for _, s := range []struct {
		pat, host string
		port      uint16
	}{
		{"api.example.com:443", "API.example.com.", 443}, {"*.example.com:*", "a.example.com", 1},
		{"*.example.com:*", "example.com", 1}, {"*.example.com:*", "evilexample.com", 1},
		{"[::1]:80", "::1%x", 80}, {"[::1]:80", "::ffff:127.0.0.1", 80}, {"127.0.0.1:80", "::ffff:127.0.0.1", 80},
		{"*:*", "x", 0}, {"a:b", "a", 1}, {"[fe80::1%eth0]:1", "fe80::1%eth0", 1}, {"*.0.1:*", "10.0.0.1", 1},
	} {
		f.Add(s.pat, s.host, s.port)
	}
	f.Fuzz(func(t *testing.T, pat, host string, port uint16) {
		m := matchDest(pat, host, port)
		if m != matchDest(pat, strings.ToUpper(host), port) && strings.ToLower(strings.ToUpper(host)) == strings.ToLower(host) {
			t.Fatalf("matchDest(%q, %q) depends on case", pat, host)
		}
		if !m {
			return
		}
		ph, pp, err := net.SplitHostPort(pat)
		if err != nil {
			t.Fatalf("matchDest(%q, %q): matched an unparseable pattern", pat, host)
		}
		if pp != "*" && pp != itoa(port) && strings.TrimLeft(pp, "0") != itoa(port) {
			t.Fatalf("matchDest(%q, %q, %d): port %s matched", pat, host, port, pp)
		}
		norm := strings.ToLower(strings.TrimSuffix(host, "."))
		ph = strings.ToLower(ph)
		switch {
		case ph == "*":
		case strings.HasPrefix(ph, "*."):
			if !strings.HasSuffix(norm, ph[1:]) || len(norm) <= len(ph)-1 {
				t.Fatalf("matchDest(%q, %q): not a proper subdomain", pat, host)
			}
			if _, err := netip.ParseAddr(norm); err == nil {
				t.Fatalf("matchDest(%q, %q): a suffix pattern matched an IP address", pat, host)
			}
		default:
			if a, err := netip.ParseAddr(ph); err == nil {
				b, err := netip.ParseAddr(norm)
				if err != nil || b.Zone() != "" || a.Zone() != "" || a.Unmap() != b.Unmap() {
					t.Fatalf("matchDest(%q, %q): IP pattern matched another address", pat, host)
				}
			} else if norm != ph {
				t.Fatalf("matchDest(%q, %q): name pattern matched a host whose normalised form %q differs", pat, host, norm)
			}
		}
	})
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// FuzzNormalizeURL: normalising is idempotent, never yields a host with a
// zone, and keeps the scheme and host (lower-cased) of what it parsed.
func FuzzNormalizeURL(f *testing.F) {
	for _, s := range []string{
		"http://Example.COM:80/a/../b?z=1&a=2#f", "https://[::1]:443/%7e%2F", "http://[::1%25x]:80/",
		"http://h/a?%zz", "http://h/%2e%2e/x", "http://h?a=1&a=0&b", "HTTP://H:8080", "http://h/a//b/./c/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n, err := NormalizeURL(raw)
		if err != nil {
			return
		}
		n2, err := NormalizeURL(n)
		if err != nil {
			t.Fatalf("NormalizeURL(%q) = %q, which does not normalise: %v", raw, n, err)
		}
		if n2 != n {
			t.Fatalf("NormalizeURL not idempotent: %q → %q → %q", raw, n, n2)
		}
		u, err := url.Parse(n)
		if err != nil {
			t.Fatalf("NormalizeURL(%q) = %q, which does not parse: %v", raw, n, err)
		}
		if strings.Contains(u.Host, "%") {
			t.Fatalf("NormalizeURL(%q) = %q: a zone or escape in the host", raw, n)
		}
		o, _ := url.Parse(raw)
		if !strings.EqualFold(u.Scheme, o.Scheme) || u.Hostname() != strings.ToLower(o.Hostname()) {
			t.Fatalf("NormalizeURL(%q) = %q: scheme or host changed", raw, n)
		}
	})
}

type fuzzSecrets map[string]Secret

func (s fuzzSecrets) Secret(_ context.Context, _, name string) (Secret, error) {
	if v, ok := s[name]; ok {
		return v, nil
	}
	return Secret{}, errNoSecret
}

var errNoSecret = http.ErrNoCookie // any error: "no such secret"

// FuzzSubstituteSecrets: a secret's value reaches only the destinations it
// is bound to — in a plain header or inside Basic credentials — and to any
// other destination the headers go unchanged or not at all; redacting the
// substituted headers leaves no value behind.
func FuzzSubstituteSecrets(f *testing.F) {
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, s := range []string{
		"Bearer amber-secret://tok", basic("user:amber-secret://tok"), basic("amber-secret://tok:amber-secret://other"),
		"amber-secret://nope", "x amber-secret://tok amber-secret://tok", basic("plain:pass"), "Basic !!!",
		"amber-secret://tok.", "Basic " + base64.RawStdEncoding.EncodeToString([]byte("u:amber-secret://tok")),
	} {
		f.Add(s, "api.test", uint16(443))
		f.Add(s, "evil.test", uint16(443))
	}
	secs := fuzzSecrets{
		"tok":   {Value: []byte("S3CRET-TOK"), Hosts: []string{"api.test:443"}},
		"other": {Value: []byte("0THER-VAL"), Hosts: []string{"*.api.test:*"}},
	}
	f.Fuzz(func(t *testing.T, v, host string, port uint16) {
		in := http.Header{"Authorization": {v}, "X-Other": {v}}
		out, sub, err := substituteSecrets(context.Background(), secs, "acme", in, host, port)
		if err != nil {
			return
		}
		for name, sec := range secs {
			val := string(sec.Value)
			bound := SecretBound(sec, host, port)
			for k, vs := range out {
				for i, o := range vs {
					got := o
					if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(o, "Basic ")); err == nil && strings.HasPrefix(o, "Basic ") {
						got += string(raw)
					}
					orig := in[k][i]
					if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(orig, "Basic ")); err == nil {
						orig += string(raw)
					}
					if strings.Contains(got, val) && !bound && !strings.Contains(orig, val) {
						t.Fatalf("secret %s sent to %s:%d (not bound): %q → %q", name, host, port, in[k][i], o)
					}
				}
			}
		}
		red := out.Clone()
		sub.redactHeader(red)
		for _, vs := range red {
			for _, o := range vs {
				for _, x := range sub.values {
					if strings.Contains(o, string(x)) {
						t.Fatalf("redaction left %q in %q", x, o)
					}
				}
			}
		}
	})
}
