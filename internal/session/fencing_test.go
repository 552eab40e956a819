package session

import (
	"context"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// blockingModel answers its first call only when released.
type blockingModel struct {
	*Scripted
	called, release chan struct{}
}

func (m *blockingModel) Complete(ctx context.Context, req Request, f func(string)) (Response, error) {
	close(m.called)
	<-m.release
	return m.Scripted.Complete(ctx, req, f)
}

// TestStaleHarnessIsFenced: a harness that lost the session's lease (a new
// one took it while the old one waited for the model) cannot record its
// answer; the session holds the new harness's answer, once.
func TestStaleHarnessIsFenced(t *testing.T) {
	e := newTestEnv(t, []ScriptTurn{{Text: "the answer"}})
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}})
	e.post(id, EventUserMessage, UserMessage{Text: "hi"})
	bm := &blockingModel{Scripted: NewScripted([]ScriptTurn{{Text: "the stale answer"}}), called: make(chan struct{}), release: make(chan struct{})}
	old := e.harness(nil)
	old.Models = func(ModelConfig) (Model, error) { return bm, nil }
	errc := make(chan error, 1)
	go func() {
		_, err := old.Wake(context.Background(), id)
		errc <- err
	}()
	select {
	case <-bm.called:
	case <-time.After(10 * time.Second):
		t.Fatal("the first harness never called the model")
	}
	// Another incarnation takes the lease over (a new epoch).
	if _, err := e.log.Acquire(context.Background(), Stream(id), "node/test", time.Minute); err != nil {
		t.Fatal(err)
	}
	close(bm.release)
	if err := <-errc; !errdefs.IsFenced(err) {
		t.Fatalf("the stale harness's append: %v, want fenced", err)
	}
	if n := len(e.events(id, EventAssistantMessage)); n != 0 {
		t.Fatalf("a fenced harness recorded %d answers", n)
	}
	if st, err := e.harness(nil).Wake(context.Background(), id); err != nil || st != StatusIdle {
		t.Fatalf("the new harness: %v %v", st, err)
	}
	s := e.state(id)
	if len(s.Messages) != 2 || s.Messages[1].Text != "the answer" {
		t.Fatalf("conversation %s", conversation(t, s))
	}
	if n := len(e.events(id, EventAssistantMessage)); n != 1 {
		t.Fatalf("%d assistant messages", n)
	}
}
