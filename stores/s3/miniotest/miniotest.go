// Package miniotest starts a real MinIO server for tests: a fresh data
// directory, a free loopback port, stopped by PID when the test ends.
//
// The server binary comes from $AMBER_MINIO_BIN, else
// ${AMBER_CACHE:-/var/cache/amber}/bin/minio, which `make setup-test`
// installs (scripts/setup/minio.sh). A missing binary fails the test: the
// S3 backend is never silently untested.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/stores/s3"
)

// The credentials every Amber test MinIO uses (as scripts/setup/minio-start.sh).
const (
	AccessKey = "amberminio"
	SecretKey = "amberminio-secret"
)

// Server is a running MinIO.
type Server struct {
	Endpoint string // 127.0.0.1:port
	PID      int
	cmd      *exec.Cmd
	logPath  string
}

// Binary returns the path of the MinIO binary tests use.
func Binary() string {
	if p := os.Getenv("AMBER_MINIO_BIN"); p != "" {
		return p
	}
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	return filepath.Join(cache, "bin", "minio")
}

// Start starts a MinIO server for t and stops it (by PID) in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	if err := CheckBinary(bin); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		srv, err := start(t, bin)
		if err == nil {
			return srv
		}
		lastErr = err
	}
	t.Fatalf("start MinIO: %v", lastErr)
	return nil
}

// CheckBinary tells why bin cannot be used as the MinIO server, naming the
// command that installs it.
func CheckBinary(bin string) error {
	fi, err := os.Stat(bin)
	if err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file")
	}
	if err != nil {
		return fmt.Errorf("MinIO server binary not usable at %s (set AMBER_MINIO_BIN, or run `make setup-test`, "+
			"which runs scripts/setup/minio.sh): %v", bin, err)
	}
	return nil
}

func start(t testing.TB, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	logPath := filepath.Join(dir, "minio.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "server", "--quiet", "--address", addr, data)
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_CI_CD=1",
		"MINIO_UPDATE=off",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Die with the test binary even if it is killed before Cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	srv := &Server{Endpoint: addr, PID: cmd.Process.Pid, cmd: cmd, logPath: logPath}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		// Stop exactly the process we started, by its PID.
		_ = syscall.Kill(srv.PID, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(srv.PID, syscall.SIGKILL)
			<-exited
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("MinIO exited during startup (%v): %s", err, tail(logPath))
		default:
		}
		if ready(addr) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("MinIO not ready on %s within 30 s: %s", addr, tail(logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(stop)
	return srv, nil
}

// ready reports whether the server answers S3 requests: /minio/health/live
// turns OK before the object layer is initialized, so also ask the
// readiness endpoint and make one authenticated call.
func ready(addr string) bool {
	c := http.Client{Timeout: time.Second}
	for _, path := range []string{"/minio/health/live", "/minio/health/ready"} {
		resp, err := c.Get("http://" + addr + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := s3.Open(ctx, s3.Config{Endpoint: addr, AccessKey: AccessKey, SecretKey: SecretKey, Bucket: "amber-probe"})
	return err == nil || errdefs.IsNotFound(err)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}

// Config returns an s3.Config for a new, empty bucket on srv.
func (srv *Server) Config() s3.Config {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return s3.Config{
		Endpoint:     srv.Endpoint,
		AccessKey:    AccessKey,
		SecretKey:    SecretKey,
		Bucket:       "test-" + hex.EncodeToString(b[:]),
		CreateBucket: true,
	}
}

// Store opens an s3.Store on a new, empty bucket on srv.
func (srv *Server) Store(t testing.TB) *s3.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := s3.Open(ctx, srv.Config())
	if err != nil {
		t.Fatalf("open MinIO store: %v (server log: %s)", err, tail(srv.logPath))
	}
	return s
}
