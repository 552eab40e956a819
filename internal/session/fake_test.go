package session

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// fakeBoxes is an in-memory Sandboxes whose state makes re-runs visible:
// every exec increments the sandbox's counter and prints it, so a command
// run twice, or run in a sandbox that was not brought back to the right
// step, prints another number than the uninterrupted run did.
type fakeBoxes struct {
	mu      sync.Mutex
	boxes   map[string]*fakeBox
	order   []string // ids in the order made
	ckpts   map[string]fakeBox
	n       int
	execs   int // every Exec, write and read: a tool execution
	cuts    int
	restore int
}

type fakeBox struct {
	running   bool
	destroyed bool
	counter   int
	files     map[string]string
	labels    map[string]string
}

func newFakeBoxes() *fakeBoxes {
	return &fakeBoxes{boxes: map[string]*fakeBox{}, ckpts: map[string]fakeBox{}}
}

func (f *fakeBoxes) box(id string) (*fakeBox, error) {
	b := f.boxes[id]
	if b == nil {
		return nil, errdefs.NotFoundf("sandbox %s", id)
	}
	if !b.running {
		return nil, errdefs.FailedPreconditionf("sandbox %s is not running", id)
	}
	return b, nil
}

func (f *fakeBoxes) Create(ctx context.Context, tenant, template string, labels map[string]string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("sbx-%d", f.n)
	f.boxes[id] = &fakeBox{running: true, files: map[string]string{}, labels: maps.Clone(labels)}
	f.order = append(f.order, id)
	return id, nil
}

func (f *fakeBoxes) Labeled(ctx context.Context, tenant string, labels map[string]string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, id := range f.order {
		if b := f.boxes[id]; !b.destroyed && metadata.Matches(b.labels, labels) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// live lists the sandboxes not destroyed (running or lost).
func (f *fakeBoxes) live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, id := range f.order {
		if !f.boxes[id].destroyed {
			ids = append(ids, id)
		}
	}
	return ids
}

func (f *fakeBoxes) Running(ctx context.Context, tenant, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[id]
	if b == nil {
		return false, errdefs.NotFoundf("sandbox %s", id)
	}
	return b.running, nil
}

func (f *fakeBoxes) Exec(ctx context.Context, tenant, id string, r ExecRequest) (ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return ExecResult{}, err
	}
	f.execs++
	b.counter++
	cmd := strings.Join(r.Args, " ")
	b.files["/history"] += cmd + "\n"
	return ExecResult{Stdout: []byte(fmt.Sprintf("counter=%d\n", b.counter))}, nil
}

func (f *fakeBoxes) ReadFile(ctx context.Context, tenant, id, path string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return nil, err
	}
	f.execs++
	s, ok := b.files[path]
	if !ok {
		return nil, errdefs.NotFoundf("%s", path)
	}
	return []byte(s), nil
}

func (f *fakeBoxes) WriteFile(ctx context.Context, tenant, id, path string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return err
	}
	f.execs++
	b.files[path] = string(data)
	return nil
}

func (f *fakeBoxes) Checkpoint(ctx context.Context, tenant, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return "", err
	}
	f.cuts++
	ck := fmt.Sprintf("ckpt-%d", f.cuts)
	f.ckpts[ck] = fakeBox{running: true, counter: b.counter, files: maps.Clone(b.files)}
	return ck, nil
}

func (f *fakeBoxes) Restore(ctx context.Context, tenant, id, ckpt string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ckpts[ckpt]
	if !ok {
		return errdefs.NotFoundf("checkpoint %s", ckpt)
	}
	f.restore++
	var labels map[string]string
	if b := f.boxes[id]; b != nil {
		labels = b.labels
	}
	f.boxes[id] = &fakeBox{running: true, counter: c.counter, files: maps.Clone(c.files), labels: labels}
	return nil
}

func (f *fakeBoxes) Destroy(ctx context.Context, tenant, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.boxes[id]; b != nil {
		b.running, b.destroyed = false, true
	}
	return nil
}

// lose kills every sandbox (a node loss).
func (f *fakeBoxes) lose() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.boxes {
		b.running = false
	}
}

func (f *fakeBoxes) counts() (execs, cuts, restores int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.execs, f.cuts, f.restore
}
