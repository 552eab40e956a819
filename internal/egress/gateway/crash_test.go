package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/lib/failpoint"
)

const steps = 3

// runProgram is the sandboxed program: it charges once per step, from the
// cut. A dropped connection is the program's (or gateway's) crash: it stops
// there. An error answer from the gateway is an answer: it goes on.
func runProgram(f *front, target string) (answered map[int]int, crashedAt int) {
	answered = map[int]int{}
	c := f.client()
	for step := 1; step <= steps; step++ {
		status, _, err := charge(c, target, step)
		if err != nil {
			return answered, step
		}
		answered[step] = status
	}
	return answered, 0
}

// TestCrashMatrix crashes the gateway at each point of the forwarding path
// while a program charges once per step, restarts it over the same journal
// store (as a daemon restart or a failover would: the store reopened, the
// lease taken over), and re-runs the program from the cut. See the
// assertions for what each mode guarantees.
func TestCrashMatrix(t *testing.T) {
	points := []string{"", gateway.FPBeforeSend, gateway.FPAfterSend, gateway.FPAfterOutcome}
	type kind struct {
		name       string
		idempotent bool // the server honours Idempotency-Key
		mode       gateway.Mode
		journal    bool
	}
	kinds := []kind{
		{"idempotent-server/idempotent-key", true, gateway.ModeIdempotentKey, true},
		{"plain-server/at-most-once", false, gateway.ModeAtMostOnce, true},
		{"idempotent-server/no-journal", true, gateway.ModeIdempotentKey, false},
		{"plain-server/no-journal", false, gateway.ModeAtMostOnce, false},
	}
	for _, k := range kinds {
		for _, point := range points {
			name := k.name + "/" + strings.TrimPrefix(point, "gateway.")
			if point == "" {
				name = k.name + "/no-crash"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				led := newLedger(t, k.idempotent)
				target := led.addr().String()
				policy := allowLoopback(led.addr())
				policy.Modes = []gateway.ModeRule{{Dest: target, Mode: k.mode}}
				path := storePath(t)
				const sb, cut = "sb-pay", "ckpt-0"

				// First life: crash at step 2's crash point.
				store := openStore(t, path)
				fp := failpoint.New()
				if point != "" {
					fp.Arm(point, 2, failpoint.ErrCrash)
				}
				opts := gateway.Options{Failpoints: fp, Logger: quietLog}
				if k.journal {
					opts.Journal = gateway.NewJournal(store)
				}
				gw1 := gateway.New(opts)
				if err := gw1.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: sb, ID: cut, Epoch: acquire(t, store, sb, "node-a"), Policy: policy}); err != nil {
					t.Fatal(err)
				}
				f := newFront(t, gw1, led.addr(), sb)
				_, crashedAt := runProgram(f, target)
				if point != "" {
					if hits := fp.Hits(point); hits < 2 {
						t.Fatalf("crash point %s hit %d times, want >= 2", point, hits)
					}
					if crashedAt != 2 {
						t.Fatalf("program crashed at step %d, want 2", crashedAt)
					}
				}
				gw1.Close()
				store.Close()
				_, before, _ := led.snapshot()

				// Second life: a new gateway over the reopened store; the
				// daemon on the node re-acquires the lease (a new epoch fencing its
				// earlier incarnation); the program re-runs from the cut.
				store = openStore(t, path)
				defer store.Close()
				opts = gateway.Options{Logger: quietLog}
				if k.journal {
					opts.Journal = gateway.NewJournal(store)
				}
				gw2 := gateway.New(opts)
				defer gw2.Close()
				if err := gw2.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: sb, ID: cut, Epoch: acquire(t, store, sb, "node-a"), Policy: policy}); err != nil {
					t.Fatal(err)
				}
				f.setGateway(gw2)
				answered, crashed2 := runProgram(f, target)
				if crashed2 != 0 {
					t.Fatalf("re-run crashed at step %d", crashed2)
				}
				charges, after, _ := led.snapshot()
				t.Logf("charges %v, answers %v, upstream requests before %v after %v", charges, answered, before, after)

				if !k.journal {
					// Negative control: without the journal the re-run
					// charges again. If this passes, the matrix proves something.
					dup := false
					for s := 1; s <= steps; s++ {
						dup = dup || charges[s] > 1
					}
					if !dup {
						t.Fatalf("negative control: no duplicated charge without the journal (%v)", charges)
					}
					return
				}

				// Steps whose outcome was recorded in the first life: the
				// re-run does not contact the upstream at all.
				recorded := map[int]bool{1: true}
				if point == "" || point == gateway.FPAfterOutcome {
					recorded[2] = true
				}
				if point == "" {
					recorded[3] = true
				}
				for s := range recorded {
					if after[s] != before[s] {
						t.Errorf("step %d: outcome was recorded, yet the re-run reached the upstream %d times", s, after[s]-before[s])
					}
				}
				recon := reconciliations(t, opts.Journal, sb)
				for s := 1; s <= steps; s++ {
					switch k.mode {
					case gateway.ModeIdempotentKey:
						if charges[s] != 1 {
							t.Errorf("step %d: %d charges, want exactly 1", s, charges[s])
						}
						if answered[s] != 200 {
							t.Errorf("step %d: answered %d, want 200", s, answered[s])
						}
					case gateway.ModeAtMostOnce:
						switch {
						case charges[s] > 1:
							t.Errorf("step %d: %d charges: at-most-once charged twice", s, charges[s])
						case charges[s] == 1:
						case recon[s]:
							if answered[s] != 502 {
								t.Errorf("step %d: needs reconciliation, answered %d, want 502", s, answered[s])
							}
						default:
							t.Errorf("step %d: no charge and no reconciliation flag", s)
						}
					}
				}
				// The unsure step is flagged exactly when the crash left an
				// intent without an outcome.
				if k.mode == gateway.ModeAtMostOnce {
					wantFlag := point == gateway.FPBeforeSend || point == gateway.FPAfterSend
					if recon[2] != wantFlag {
						t.Errorf("step 2 needs reconciliation: %v, want %v", recon[2], wantFlag)
					}
				}
				checkJournalOrder(t, readStream(t, store, gateway.Stream(sb)))
			})
		}
	}
}

// reconciliations returns the steps whose charge is marked as needing
// reconciliation.
func reconciliations(t *testing.T, j *gateway.Journal, sb string) map[int]bool {
	es, err := j.Reconciliations(context.Background(), sb)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, e := range es {
		// Step s is the s-th POST /charge since the cut: its slot.
		if e.Intent != nil {
			out[e.Intent.Slot] = true
		}
	}
	return out
}

// checkJournalOrder asserts the durability order in the stream: every
// outcome comes after an intent of its key.
func checkJournalOrder(t *testing.T, evs []eventlog.Event) {
	t.Helper()
	seenIntent := map[string]bool{}
	for _, ev := range evs {
		var p struct {
			Key string `json:"key"`
		}
		if err := jsonUnmarshal(ev.Payload, &p); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case gateway.EventIntent:
			seenIntent[p.Key] = true
		case gateway.EventOutcome:
			if !seenIntent[p.Key] {
				t.Errorf("event %d: outcome of %s before any intent", ev.Seq, p.Key)
			}
		}
	}
}
