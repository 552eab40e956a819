package gateway

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// Key identifies one request of a run in the journal: the run (the cut it
// started from), the request's canonical content, and its occurrence number
// among identical requests since the cut. Two requests with the same Key are
// the same effect. Forks of one checkpoint are different sandboxes, so
// their effects have different keys.
type Key struct {
	Sandbox    string
	Run        string
	Method     string
	URL        string // NormalizeURL form
	BodySHA256 string // hex
	Occurrence int    // 1 for the first identical request since the cut
}

// ID is the key's stable digest (hex SHA-256 of its fields,
// length-prefixed). It names the key's events and derives the
// Idempotency-Key sent upstream.
func (k Key) ID() string {
	return digestFields(k.Sandbox, k.Run, k.Method, k.URL, k.BodySHA256, strconv.Itoa(k.Occurrence))
}

// IdempotencyKey is the Idempotency-Key header the gateway sends for k: the
// same on every attempt of the same effect, in any gateway instance.
func (k Key) IdempotencyKey() string { return "amber-" + k.ID()[:40] }

// slot is a request's position for divergence detection: the n-th request
// to the same method and URL since the cut. A re-run request whose Key is not
// recorded but whose slot is (with another body) diverged.
type slot struct {
	Run        string
	Method     string
	URL        string
	Occurrence int
}

func (s slot) id() string {
	return digestFields("slot", s.Run, s.Method, s.URL, strconv.Itoa(s.Occurrence))
}

// contentID identifies a request's content within a run (Key without the
// occurrence number): the counter of identical requests is kept per contentID.
func contentID(run, method, u, body string) string {
	return digestFields(run, method, u, body)
}

func digestFields(fields ...string) string {
	h := sha256.New()
	var n [4]byte
	for _, f := range fields {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// NormalizeURL returns the canonical form of an absolute URL used in keys:
// scheme and host lower-cased, the scheme's default port dropped, an empty
// path as "/", dot segments resolved, query parameters sorted by name (the
// order of repeated values kept), the fragment dropped.
func NormalizeURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme == "" || u.Hostname() == "" || u.Opaque != "" {
		return "", errdefs.InvalidArgumentf("URL %.80q: not an absolute URL", raw)
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, "%") {
		return "", errdefs.InvalidArgumentf("URL %.80q: an IPv6 zone names no destination", raw)
	}
	port := u.Port()
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		if _, err := netip.ParseAddr(host); err != nil {
			return "", errdefs.InvalidArgumentf("URL %.80q: host %q is not an IPv6 address", raw, host)
		}
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	p := u.EscapedPath()
	if p == "" {
		p = "/"
	}
	p = cleanPath(normalizeEscapes(p))
	out := scheme + "://" + host + p
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			// Not form-encoded: keep it verbatim, it is still deterministic.
			return out + "?" + u.RawQuery, nil
		}
		if e := encodeSorted(q); e != "" {
			out += "?" + e
		}
	}
	return out, nil
}

// normalizeEscapes decodes percent-escapes of unreserved characters and
// upper-cases the hex of the others (RFC 3986, 6.2.2.2).
func normalizeEscapes(p string) string {
	if !strings.Contains(p, "%") {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			c := unhex(p[i+1])<<4 | unhex(p[i+2])
			if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
				b.WriteByte(c)
			} else {
				b.WriteString(strings.ToUpper(p[i : i+3]))
			}
			i += 2
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// cleanPath resolves "." and ".." segments, keeping a trailing slash.
func cleanPath(p string) string {
	segs := strings.Split(p, "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		switch s {
		case ".":
			if i == len(segs)-1 {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if i == len(segs)-1 {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	r := strings.Join(out, "/")
	if !strings.HasPrefix(r, "/") {
		r = "/" + r
	}
	return r
}

func encodeSorted(q url.Values) string {
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		for _, v := range q[k] {
			if b.Len() > 0 {
				b.WriteByte('&')
			}
			b.WriteString(url.QueryEscape(k))
			b.WriteByte('=')
			b.WriteString(url.QueryEscape(v))
		}
	}
	return b.String()
}
