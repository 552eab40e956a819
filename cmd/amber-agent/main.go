// Command amber-agent is the program every sandbox runs as its init (PID 1):
// it reaps orphans, starts every process the daemon asks for as its own
// child (so each is in the sandbox's process tree, part of every checkpoint,
// and back after every restore, on both drivers), keeps each process's output
// in a bounded ring in the sandbox's memory (so a client re-attaches from an
// offset after a restore or a daemon restart), serves the sandbox's files
// as the sandbox sees them, and watches them with inotify. The daemon
// reaches it over the driver's port dialer; see lib/agentproto for the
// protocol.
//
// It is a static binary (CGO_ENABLED=0) that needs nothing of the template:
// the drivers bind it read-only at agentproto.Path. It runs with the
// sandbox's privileges only and decides nothing for the host: everything it
// answers is the sandbox's word.
//
// May import: lib.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/amber-run/amber/lib/agentproto"
)

func main() {
	// The agent is small and lives as long as the sandbox; keep its heap
	// close to what it uses (it counts against the sandbox's memory).
	debug.SetGCPercent(50)
	log.SetFlags(0)
	log.SetPrefix("amber-agent: ")
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(agentproto.Version)
		return
	}
	token := os.Getenv(agentproto.TokenEnv)
	os.Unsetenv(agentproto.TokenEnv)
	if token == "" {
		log.Fatalf("no %s in the environment", agentproto.TokenEnv)
	}
	addr := "127.0.0.1:" + strconv.Itoa(agentproto.Port)
	if a := os.Getenv("AMBER_AGENT_ADDR"); a != "" { // tests on the host
		addr = a
		os.Unsetenv("AMBER_AGENT_ADDR")
	}
	a := newAgent(token)
	a.ignoreTermination()
	go a.reap()
	// Plain TCP, never MPTCP (Go's listeners use MPTCP where the kernel
	// has it): CRIU cannot dump an MPTCP socket.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		log.Fatalf("listen %s: %v", addr, err)
	}
	if err := a.serve(ln); err != nil {
		log.Fatalf("serve: %v", err)
	}
}

// agent is the state of the one agent of a sandbox.
type agent struct {
	token string
	procs *table

	buildOnce sync.Once
	build     string
}

func newAgent(token string) *agent {
	return &agent{token: token, procs: newTable()}
}

// ignoreTermination keeps the init alive on the signals a shell's init
// traps (TERM, INT, HUP, and the job-control and user signals): as PID 1
// the kernel would drop them anyway, but the Go runtime's own handler for
// TERM would end the process and with it the sandbox. Handled, not
// ignored: an ignored signal stays ignored in every child it starts.
func (a *agent) ignoreTermination() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGQUIT, syscall.SIGPIPE)
	go func() {
		for range ch {
		}
	}()
}

// serve answers HTTP/2 without TLS on ln.
func (a *agent) serve(ln net.Listener) error {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	protos.SetHTTP1(true) // health checks by hand (curl) inside the sandbox
	srv := &http.Server{
		Handler:           a.routes(),
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: 4096,
			// Bigger frames than HTTP/2's 16 KiB: a file upload is
			// one stream, and under gVisor every frame is a trip
			// through the sentry's network stack.
			MaxReadFrameSize: 256 << 10,
			// A connection the host dropped without a word (its side
			// was a daemon that died, or a peer that a restore left
			// behind) is closed after this long without a ping.
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	return srv.Serve(ln)
}

// buildID is the digest of the agent's own binary: what the checkpoint
// manifest records as the agent's build.
func (a *agent) buildID() string {
	a.buildOnce.Do(func() {
		f, err := os.Open("/proc/self/exe")
		if err != nil {
			a.build = "unknown"
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			a.build = "unknown"
			return
		}
		a.build = "sha256:" + hex.EncodeToString(h.Sum(nil))
	})
	return a.build
}

// health answers GET /v1/health.
func (a *agent) health(ctx context.Context) agentproto.Health {
	return agentproto.Health{Protocol: agentproto.Version, Build: a.buildID(), PID: os.Getpid(), Init: os.Getpid() == 1}
}
