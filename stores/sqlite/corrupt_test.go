package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// TestDamage covers damage the generic Corrupt hook cannot express: rows
// that are valid envelopes but in the wrong place, rows that vanished, and
// torn blobs. Each must read as ErrDataLoss naming the stream and the
// position, and never as an event.
func TestDamage(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, s *Store, stream string)
	}{
		{"envelope of another position", func(t *testing.T, s *Store, stream string) {
			rawExec(t, s, stream, `UPDATE events SET env = ?3 WHERE sid = ?1 AND seq = ?2`, int64(5), rawEnvelope(t, s, stream, 4))
		}},
		{"envelope of another stream", func(t *testing.T, s *Store, stream string) {
			rawExec(t, s, stream, `UPDATE events SET env = ?3 WHERE sid = ?1 AND seq = ?2`, int64(5), rawEnvelope(t, s, stream+"-other", 5))
		}},
		{"envelope re-signed for another tenant", func(t *testing.T, s *Store, stream string) {
			ev, err := eventlog.Decode(rawEnvelope(t, s, stream, 5))
			if err != nil {
				t.Fatal(err)
			}
			ev.Tenant = "intruder"
			env, err := eventlog.Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			rawExec(t, s, stream, `UPDATE events SET env = ?3 WHERE sid = ?1 AND seq = ?2`, int64(5), env)
		}},
		{"row deleted", func(t *testing.T, s *Store, stream string) {
			rawExec(t, s, stream, `DELETE FROM events WHERE sid = ?1 AND seq = ?2`, int64(5))
		}},
		{"last row deleted", func(t *testing.T, s *Store, stream string) {
			rawExec(t, s, stream, `DELETE FROM events WHERE sid = ?1 AND seq = ?2`, int64(8))
		}},
		{"torn blob", func(t *testing.T, s *Store, stream string) {
			env := rawEnvelope(t, s, stream, 5)
			rawExec(t, s, stream, `UPDATE events SET env = ?3 WHERE sid = ?1 AND seq = ?2`, int64(5), env[:len(env)/2])
		}},
		{"empty blob", func(t *testing.T, s *Store, stream string) {
			rawExec(t, s, stream, `UPDATE events SET env = x'' WHERE sid = ?1 AND seq = ?2`, int64(5))
		}},
		{"checksum byte", func(t *testing.T, s *Store, stream string) {
			env := rawEnvelope(t, s, stream, 5)
			flipByte(t, s, stream, 5, len(env)-1)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTest(t, filepath.Join(t.TempDir(), "log.db"), clock.Real{})
			stream := "session/damage"
			for _, name := range []string{stream, stream + "-other"} {
				var batch []eventlog.Event
				for i := range 8 {
					batch = append(batch, eventlog.Event{Tenant: "t", ID: fmt.Sprintf("%s#%d", name, i), Type: "x", Version: 1, Payload: json.RawMessage(`{}`)})
				}
				if _, err := s.Append(ctx, name, 0, 0, batch...); err != nil {
					t.Fatal(err)
				}
			}
			c.damage(t, s, stream)
			bad := uint64(5)
			if strings.HasPrefix(c.name, "last") {
				bad = 8
			}
			for _, from := range []uint64{1, bad} {
				evs, err := s.Read(ctx, stream, from, 100)
				if !errdefs.IsDataLoss(err) || len(evs) != 0 {
					t.Fatalf("Read(%d) = %d events, %v; want ErrDataLoss", from, len(evs), err)
				}
				if want := fmt.Sprintf("stream %s seq %d", stream, bad); !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not say %q", err, want)
				}
			}
			if evs, err := s.Read(ctx, stream, 1, int(bad-1)); err != nil || len(evs) != int(bad-1) {
				t.Fatalf("Read before the damage = %d events, %v", len(evs), err)
			}
		})
	}
}
