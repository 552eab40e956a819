package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/stores/localfs"
)

// tlsUpstream is an HTTPS server on 127.0.0.1 with a certificate for any
// name, signed by its own CA (the daemon trusts it with --egress-ca-file).
// /echo-auth reflects the Authorization header it received, as a careless
// server would.
type tlsUpstream struct {
	port   uint16
	caFile string
	mu     sync.Mutex
	auths  []string
	paths  []string
}

func startTLSUpstream(t *testing.T) *tlsUpstream {
	ca, err := gateway.NewCA("upstream-test")
	if err != nil {
		t.Fatal(err)
	}
	u := &tlsUpstream{caFile: filepath.Join(t.TempDir(), "upstream-ca.pem")}
	certPEM, _, _ := ca.PEM()
	if err := os.WriteFile(u.caFile, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.paths = append(u.paths, r.Host+r.URL.Path)
		u.mu.Unlock()
		fmt.Fprintf(w, "proto=%s auth=%s", r.Proto, r.Header.Get("Authorization"))
	})}
	go srv.Serve(tls.NewListener(ln, ca.ServerConfig("payments.test")))
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *tlsUpstream) seen() ([]string, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auths...), append([]string(nil), u.paths...)
}

// memoryScript holds, in memory only, a positive-control marker computed
// at run time and the answer of a request that carried the secret's
// placeholder; the checkpoint image must show the first and not the value.
const memoryScript = `import hashlib, os, time, urllib.request
marker = hashlib.sha256(b"amber-positive-control").hexdigest()
req = urllib.request.Request(os.environ["URL"], headers={"Authorization": "Bearer " + os.environ["STRIPE_KEY"]})
held = [marker, urllib.request.urlopen(req, timeout=30).read().decode()]
open("/tmp/ready", "w").write("ok")
while True:
    time.sleep(1)
`

// TestE2ESecretsAndTLS: HTTPS from curl and python3 in the python template
// goes through the gateway (TLS terminated with the tenant's CA, installed
// in the sandbox; re-encrypted upstream with verification); a secret's
// placeholder is replaced for its bound host only; and the value appears
// nowhere: not in the sandbox's files, its memory image in the checkpoint,
// the event log (the journal), the metadata database, or the daemon's log.
func TestE2ESecretsAndTLS(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	bin, dir := e2eSetup(t)
	up := startTLSUpstream(t)
	pay := fmt.Sprintf("payments.test:%d", up.port)
	other := fmt.Sprintf("other.test:%d", up.port)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0",
		"--egress-host", "payments.test=127.0.0.1", "--egress-host", "other.test=127.0.0.1", "--egress-ca-file", up.caFile)

	raw := make([]byte, 16)
	rand.Read(raw)
	value := "sk_live_" + hex.EncodeToString(raw)
	if out, errs, code := d.amberIn(value+"\n", "secret", "set", "stripe", "--host", pay); code != 0 || !strings.Contains(out, "amber-secret://stripe") {
		t.Fatalf("secret set: %d %q %q", code, out, errs)
	}
	if ls := d.must("secret", "ls"); !strings.Contains(ls, "stripe") || strings.Contains(ls, value) {
		t.Fatalf("secret ls: %q", ls)
	}
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "python", "-e", "STRIPE_KEY=amber-secret://stripe",
		"--egress-allow", pay+","+other))

	// curl: verifies the gateway's certificate with the system bundle.
	curl := d.must("exec", id, "--", "sh", "-c", `curl -sS --fail-with-body -H "Authorization: Bearer $STRIPE_KEY" https://`+pay+`/echo-auth`)
	if !strings.Contains(curl, "auth=Bearer amber-secret://stripe") {
		t.Fatalf("curl through the gateway: %q (want the echo redacted back to the placeholder)", curl)
	}
	// python3's ssl, HTTP/1.1 through the same path.
	py := d.must("exec", id, "--", "python3", "-c", `import os, urllib.request
r = urllib.request.Request("https://`+pay+`/echo-auth", headers={"Authorization": "Bearer " + os.environ["STRIPE_KEY"]})
print(urllib.request.urlopen(r, timeout=30).read().decode())`)
	if !strings.Contains(py, "auth=Bearer amber-secret://stripe") {
		t.Fatalf("python3 through the gateway: %q", py)
	}
	auths, _ := up.seen()
	if len(auths) != 2 || auths[0] != "Bearer "+value || auths[1] != "Bearer "+value {
		t.Fatalf("the upstream received %d requests; want 2 carrying the real value", len(auths))
	}
	// Not bound to other.test: refused, nothing sent.
	out, _, code := d.amber("exec", id, "--", "sh", "-c", `curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $STRIPE_KEY" https://`+other+`/echo-auth`)
	if code != 0 || strings.TrimSpace(out) != "403" {
		t.Fatalf("the secret sent to a host it is not bound to: exit %d, status %q", code, out)
	}
	// Without the tenant's CA, TLS to the gateway does not verify: the
	// gateway is not trusted by accident.
	if _, _, code := d.amber("exec", id, "--", "sh", "-c", `curl -sS --cacert /dev/null https://`+pay+`/echo-auth`); code == 0 {
		t.Fatal("curl verified the gateway with an empty trust store")
	}
	if n, _ := up.seen(); len(n) != 2 {
		t.Fatalf("refused requests reached the upstream (%d requests)", len(n))
	}

	// A program holding a redacted answer in memory, then a checkpoint.
	d.must("exec", "-d", id, "-e", "URL=https://"+pay+"/echo-auth", "--", "python3", "-c", memoryScript)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, _, code := d.amber("exec", id, "--", "test", "-e", "/tmp/ready"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory program did not get its answer\n%s", tail(d.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var ck struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	if err := json.Unmarshal([]byte(d.must("checkpoint", "--json", id)), &ck); err != nil {
		t.Fatal(err)
	}
	if ck.Tenant == "" {
		var sb struct {
			Tenant string `json:"tenant"`
		}
		if err := json.Unmarshal([]byte(d.must("sandbox", "inspect", id)), &sb); err != nil || sb.Tenant == "" {
			t.Fatalf("sandbox inspect: tenant %q, %v", sb.Tenant, err)
		}
		ck.Tenant = sb.Tenant
	}

	// Grep everything.
	needle := []byte(value)
	marker := sha256.Sum256([]byte("amber-positive-control"))
	markerHex := []byte(hex.EncodeToString(marker[:]))
	// The sandbox's files (its own writes live under these directories).
	// The needle goes in as two halves, so the full value is on no command
	// line and in no event the test itself causes.
	half := len(value) / 2
	if out, _, code := d.amber("exec", id, "-e", "NEEDLE_A="+value[:half], "-e", "NEEDLE_B="+value[half:], "--", "sh", "-c",
		`grep -rIl -F "$NEEDLE_A$NEEDLE_B" /root /tmp /etc /var /home /run /usr/local 2>/dev/null`); code == 0 {
		t.Fatalf("the value is in the sandbox's files: %s", out)
	}
	// Positive control for that grep: the same command finds the placeholder.
	if out, _, code := d.amber("exec", id, "-e", "NEEDLE_A=amber-secret:", "-e", "NEEDLE_B=//stripe", "--", "sh", "-c",
		`echo "$STRIPE_KEY" > /root/placeholder.txt; grep -rIl -F "$NEEDLE_A$NEEDLE_B" /root /tmp /etc /var /home /run /usr/local 2>/dev/null`); code != 0 || !strings.Contains(out, "/root/placeholder.txt") {
		t.Fatalf("positive control: the grep did not find a file holding the placeholder (exit %d, %q)", code, out)
	}

	imageDir := filepath.Join(t.TempDir(), "image")
	restoreImage(t, dir, ck.Tenant, ck.ID, imageDir)
	sawMarker := false
	filepath.WalkDir(imageDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, needle) {
			t.Errorf("the value is in the checkpoint: %s", p)
		}
		sawMarker = sawMarker || bytes.Contains(b, markerHex)
		return nil
	})
	if !sawMarker {
		t.Fatal("positive control: the program's in-memory marker is not in the checkpoint image, so grepping it proves nothing")
	}
	for _, f := range []string{"events.db", "events.db-wal", "meta.db", "meta.db-wal"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if bytes.Contains(b, needle) {
			t.Errorf("the value is in %s", f)
		}
	}
	if strings.Contains(d.log(), value) {
		t.Error("the value is in the daemon's log")
	}
	fx := d.must("--json", "sandbox", "effects", id)
	if !strings.Contains(fx, "echo-auth") || strings.Contains(fx, value) {
		t.Errorf("effects: %s", fx)
	}
	if audit := d.must("--json", "audit", "ls"); !strings.Contains(audit, "secrets=stripe") || strings.Contains(audit, value) {
		t.Errorf("secret use not audited by name:\n%s", tail(audit, 10))
	}
	// The gateway's decisions are counted in /metrics (the operator's key).
	key, _ := os.ReadFile(filepath.Join(dir, "admin.key"))
	req, _ := http.NewRequest("GET", "http://"+d.addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`amber_gateway_decisions_total{kind="forward",tenant="default"}`, `amber_gateway_decisions_total{kind="deny",tenant="default"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	d.must("sandbox", "rm", id)
}

// restoreImage decrypts checkpoint id of tenant from the data dir's blob
// store into dst, with the data dir's master key, as a restore would.
func restoreImage(t *testing.T, dataDir, tenant, id, dst string) {
	t.Helper()
	hexKey, err := os.ReadFile(filepath.Join(dataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(hexKey)))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := localfs.Open(filepath.Join(dataDir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: key})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cs.Restore(ctx, tenant, id, dst, chunkstore.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
}
