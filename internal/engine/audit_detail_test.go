package engine

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/stores/sqlite"
)

// TestSystemAuditHidesInternalDetail: the engine's own acts go to the
// tenant's trail, which the tenant reads; an internal error there says
// "internal error" (its text, naming the daemon's paths, is logged), and
// an error of any other kind keeps its message.
func TestSystemAuditHidesInternalDetail(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "events.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var logs strings.Builder
	e := &Engine{core: &core{audit: audit.New(st, nil), lg: slog.New(slog.NewTextHandler(&logs, nil))}}
	ctx := context.Background()
	e.auditSystem(ctx, "acme", "sandbox.idle_stop", "sbx-1", fmt.Errorf("write /var/lib/amber/work/ckpt-1/pages.img: input/output error"))
	e.auditSystem(ctx, "acme", "sandbox.idle_stop", "sbx-2", errdefs.ResourceExhaustedf("quota max_checkpoints of tenant acme"))
	recs, err := e.audit.List(ctx, "acme", 1, 10)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%v %v", recs, err)
	}
	if recs[0].Outcome != "internal" || recs[0].Detail != "internal error" {
		t.Errorf("internal error in the trail: %+v", recs[0].Record)
	}
	if !strings.Contains(recs[1].Detail, "quota max_checkpoints") {
		t.Errorf("another kind lost its message: %+v", recs[1].Record)
	}
	if !strings.Contains(logs.String(), "/var/lib/amber/work") {
		t.Errorf("the detail is not logged: %s", logs.String())
	}
}
