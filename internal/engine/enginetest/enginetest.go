// Package enginetest builds real engines for tests: a real sandbox driver
// (gvisor by default; AMBER_TEST_DRIVER=criu for the other), SQLite metadata
// and event log files in a temporary directory, and the templates installed
// under $AMBER_CACHE/templates by `make setup`. Nothing is mocked.
//
// When the driver or the minimal template is missing the tests are skipped
// with the command that installs them, except under CI (CI=true), where that
// is a failure: `make test` installs everything first.
package enginetest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/lib/failpoint"
	"github.com/amber-run/amber/stores/localfs"
	"github.com/amber-run/amber/stores/sqlite"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// Main runs a test binary's tests after the drivers' init hooks (a driver
// may re-execute the test binary as a helper). Use it as TestMain:
//
//	func TestMain(m *testing.M) { enginetest.Main(m) }
func Main(m *testing.M) {
	RunInitHooks()
	os.Exit(m.Run())
}

// RunInitHooks runs the drivers' init hooks; a TestMain that does more than
// Main calls it first.
func RunInitHooks() {
	for _, h := range initHooks {
		h()
	}
}

var (
	initHooks []func()
	// factories make a driver keeping its state in stateDir; fps, when
	// set, is its Options.Failpoints.
	factories = map[string]func(stateDir string, lg *slog.Logger, fps *failpoint.Set) (sandbox.Driver, error){}
)

// DriverName is the driver the tests run against.
func DriverName() string {
	if d := os.Getenv("AMBER_TEST_DRIVER"); d != "" {
		return d
	}
	return "gvisor"
}

// Cache is $AMBER_CACHE (default /var/cache/amber).
func Cache() string {
	if c := os.Getenv("AMBER_CACHE"); c != "" {
		return c
	}
	return "/var/cache/amber"
}

// missing skips the test (or fails it under CI) because something that
// `make setup` installs is not there.
func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI runs `make setup` first; it did not work)", what)
	}
	t.Skipf("%s; run `make setup` as root to install it", what)
}

// NewDriver returns the test driver keeping its state in stateDir.
func NewDriver(t testing.TB, stateDir string) sandbox.Driver {
	t.Helper()
	return newDriver(t, DriverName(), stateDir, nil)
}

func newDriver(t testing.TB, name, stateDir string, fps *failpoint.Set) sandbox.Driver {
	t.Helper()
	f, ok := factories[name]
	if !ok {
		t.Fatalf("driver %s: no such driver in enginetest", name)
	}
	d, err := f(stateDir, Logger(t), fps)
	if err != nil {
		t.Fatalf("new %s driver: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Check(ctx); err != nil {
		missing(t, "driver "+name+" is not usable: "+err.Error())
	}
	return d
}

// Catalog returns the installed templates (a catalog with its own local
// cache in a temporary directory, no blob store); it needs at least
// "minimal".
func Catalog(t testing.TB) *engine.Catalog {
	t.Helper()
	return catalog(t, engine.CatalogOptions{Root: t.TempDir()})
}

func catalog(t testing.TB, o engine.CatalogOptions) *engine.Catalog {
	t.Helper()
	o.Dir, o.Logger = filepath.Join(Cache(), "templates"), Logger(t)
	c, err := engine.NewCatalog(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("minimal"); err != nil {
		missing(t, "template minimal is not installed: "+err.Error())
	}
	return c
}

// Logger logs to the test's output when -v is given, else nowhere.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Env is one engine with its stores, all under Dir.
type Env struct {
	Dir     string
	Driver  sandbox.Driver
	Meta    metadata.Store
	Log     eventlog.Store
	Engine  *engine.Engine
	Catalog *engine.Catalog
	// Audit is the engine's audit trail (on Log).
	Audit *audit.Trail
	// Blobs is the checkpoint blob store's directory (Dir/blobs).
	Blobs string
	// FailAt, when set, is the chunk store's failpoint (chunkstore.Config.FailAt).
	FailAt func(step string) error
	// MetaFailpoints, when set, are the metadata store's failpoints
	// (sqlmeta.Options.Failpoints: "meta.read", "meta.write") from the next
	// open (Restart) on.
	MetaFailpoints *failpoint.Set
	// WrapDriver, when set, wraps the driver the engine is given, from the
	// next open (Restart) on (a test's misbehaving driver).
	WrapDriver func(sandbox.Driver) sandbox.Driver
	// WrapMeta, when set, wraps the metadata store the engine is given,
	// from the next open (Restart) on (a store failing one call).
	WrapMeta func(metadata.Store) metadata.Store
	// WrapLog, when set, wraps the event log the engine is given, from
	// the next open (Restart) on.
	WrapLog func(eventlog.Store) eventlog.Store
	opts    engine.Options
	driver  string
}

// TestMasterKey is the checkpoint store's master key in tests.
var TestMasterKey = []byte("amber-enginetest-master-key-32b!")

// New starts an engine in a fresh directory. opts may set Pool and
// WatchInterval; the rest is filled in. Everything is destroyed and closed
// when the test ends.
func New(t testing.TB, opts engine.Options) *Env {
	t.Helper()
	return NewFor(t, DriverName(), opts)
}

// NewFor is New with the named driver ("gvisor" or "criu").
func NewFor(t testing.TB, driver string, opts engine.Options) *Env {
	t.Helper()
	return NewWithDriverFailpoints(t, driver, opts, nil)
}

// NewWithDriverFailpoints is NewFor with fps as the driver's failpoints
// (its Options.Failpoints: the layer archive's, layer.FPArchiveListed…).
func NewWithDriverFailpoints(t testing.TB, driver string, opts engine.Options, fps *failpoint.Set) *Env {
	t.Helper()
	dir, err := os.MkdirTemp("", "amber-enginetest-")
	if err != nil {
		t.Fatal(err)
	}
	// Sandboxes (criu's user namespaces) must be able to reach their state.
	os.Chmod(dir, 0o711)
	env := &Env{Dir: dir, opts: opts, driver: driver, Blobs: filepath.Join(dir, "blobs")}
	env.Driver = newDriver(t, driver, filepath.Join(dir, "driver"), fps)
	env.open(t)
	t.Cleanup(func() {
		env.Close(t)
		env.destroyAll(t)
		if err := RemoveAll(dir); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	return env
}

func (env *Env) open(t testing.TB) {
	t.Helper()
	var err error
	if env.Meta, err = sqlmeta.Open(filepath.Join(env.Dir, "meta.db"), sqlmeta.Options{Failpoints: env.MetaFailpoints}); err != nil {
		t.Fatal(err)
	}
	if env.Log, err = sqlite.Open(filepath.Join(env.Dir, "events.db"), sqlite.Options{Logger: Logger(t)}); err != nil {
		t.Fatal(err)
	}
	o := env.opts
	o.Driver, o.Meta, o.Log = env.Driver, env.Meta, env.Log
	if env.WrapDriver != nil {
		o.Driver = env.WrapDriver(env.Driver)
	}
	if env.WrapMeta != nil {
		o.Meta = env.WrapMeta(env.Meta)
	}
	if env.WrapLog != nil {
		o.Log = env.WrapLog(env.Log)
	}
	if o.Logger == nil {
		o.Logger = Logger(t)
	}
	env.Audit = audit.New(env.Log, nil)
	o.Audit = env.Audit
	if o.Checkpoints == nil {
		bs, err := localfs.Open(env.Blobs)
		if err != nil {
			t.Fatal(err)
		}
		o.Checkpoints, err = chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: TestMasterKey, Logger: Logger(t),
			FailAt: func(step string) error {
				if env.FailAt != nil {
					return env.FailAt(step)
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Templates: this env's own cache of versions (Dir/templates) over
	// its blob store, so versions are pushed and fetched as on a node.
	// Its own chunk store over the same blobs, without FailAt: the
	// failpoint is the checkpoints' (a checkpoint pushes its template
	// version first, which must not be what fails).
	if o.Templates == nil {
		bs, err := localfs.Open(env.Blobs)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: TestMasterKey, Logger: Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		o.Templates = catalog(t, engine.CatalogOptions{Root: filepath.Join(env.Dir, "templates"), Blobs: bs, Chunks: cs})
	}
	env.Catalog = o.Templates
	if o.WorkDir == "" {
		o.WorkDir = filepath.Join(env.Dir, "work")
		if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if o.WatchInterval == 0 {
		o.WatchInterval = -1
	}
	if env.Engine, err = engine.New(o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Engine.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// Close stops the engine (draining its pool) and closes the stores. It is
// safe to call twice.
func (env *Env) Close(t testing.TB) {
	if env.Engine == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Engine.Close(ctx); err != nil {
		t.Errorf("close engine: %v", err)
	}
	env.Log.Close()
	env.Meta.Close()
	env.Engine = nil
}

// SetOptions changes the engine options the next Restart uses.
func (env *Env) SetOptions(f func(*engine.Options)) { f(&env.opts) }

// Restart closes the engine and opens a new one over the same directory,
// driver state and stores: what a daemon restart does.
func (env *Env) Restart(t testing.TB) {
	t.Helper()
	env.Close(t)
	env.open(t)
}

// destroyAll removes every sandbox the driver still has.
func (env *Env) destroyAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	infos, err := env.Driver.List(ctx)
	if err != nil {
		t.Errorf("list sandboxes to clean up: %v", err)
		return
	}
	for _, in := range infos {
		if err := env.Driver.Destroy(ctx, in.ID); err != nil {
			t.Errorf("clean up %s: %v", in.ID, err)
		}
	}
}

// RemoveAll removes dir after detaching whatever a driver left mounted
// under it (gVisor keeps a network namespace bind-mounted in its state).
func RemoveAll(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		var targets []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
				targets = append(targets, f[4])
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(targets)))
		for _, t := range targets {
			syscall.Unmount(t, syscall.MNT_DETACH)
		}
	}
	return os.RemoveAll(dir)
}
