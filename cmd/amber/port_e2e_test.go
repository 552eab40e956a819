package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestE2EPortExpose: `amber port expose` prints a URL that serves a page
// from busybox httpd inside the sandbox; ls lists it; rm makes it 404.
func TestE2EPortExpose(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t))
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "sh", "-c", "mkdir -p /www && echo port-e2e > /www/index.html && httpd -p 127.0.0.1:8080 -h /www")
	u := strings.TrimSpace(d.must("port", "expose", id, "8080"))
	if !strings.HasPrefix(u, "http://") || !strings.Contains(u, "/p/"+id+"/8080/") {
		t.Fatalf("expose printed %q", u)
	}
	get := func() (int, string) {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get()
		if code == 200 && body == "port-e2e\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q", u, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := d.must("port", "ls", id); !strings.Contains(out, "8080") {
		t.Fatalf("port ls: %q", out)
	}
	var x struct {
		URL   string `json:"url"`
		Token string `json:"token"`
		Port  int    `json:"port"`
	}
	if err := json.Unmarshal([]byte(d.must("port", "expose", "--json", id, "8080")), &x); err != nil || x.Port != 8080 || x.Token == "" || !strings.Contains(x.URL, x.Token) {
		t.Fatalf("expose --json: %+v %v", x, err)
	}
	if code, _ := get(); code != 404 {
		t.Fatalf("the first URL after re-expose = %d, want 404", code)
	}
	u = x.URL
	d.must("port", "rm", id, "8080")
	if code, _ := get(); code != 404 {
		t.Fatalf("after rm = %d, want 404", code)
	}
	if _, errs, code := d.amber("port", "expose", id, "http"); code != 2 || !strings.Contains(errs, "1..65535") {
		t.Fatalf("bad port: exit %d %q", code, errs)
	}
	d.must("sandbox", "rm", id)
}
