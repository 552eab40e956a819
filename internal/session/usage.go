package session

import (
	"context"
	"encoding/json"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
)

// ModelUsage returns engine.ModelUsage over the sessions' logs: one usage
// record per model answer (model_request_ended), whose tokens the adapter
// reported. A model answer is recorded once and never requested again, so
// a crash or a restore neither loses nor repeats tokens in this meter; a
// call cut off before its answer was recorded is not in it (its tokens are
// the provider's to bill, not recorded by Amber).
func ModelUsage(log eventlog.Store, m metadata.Sessions) engine.ModelUsage {
	return func(ctx context.Context, tenant string, from, to time.Time) ([]engine.UsageRecord, error) {
		ses, err := m.ListSessions(ctx, tenant)
		if err != nil {
			return nil, err
		}
		var out []engine.UsageRecord
		for _, se := range ses {
			for pos := uint64(1); ; {
				evs, err := log.Read(ctx, Stream(se.ID), pos, 1000)
				if errdefs.IsCompacted(err) {
					b, berr := log.Bounds(ctx, Stream(se.ID))
					if berr != nil {
						return nil, berr
					}
					pos = b.First
					continue
				}
				if err != nil {
					return nil, err
				}
				for _, ev := range evs {
					if ev.Type != EventModelRequestEnded || ev.Tenant != tenant {
						continue
					}
					if (!from.IsZero() && ev.Time.Before(from)) || (!to.IsZero() && !ev.Time.Before(to)) {
						continue
					}
					var p ModelRequestEnded
					if err := json.Unmarshal(ev.Payload, &p); err != nil {
						return nil, errdefs.DataLossf("%s/%d: %v", ev.Stream, ev.Seq, err)
					}
					for meter, n := range map[string]int{engine.MeterModelInputTokens: p.Usage.InputTokens, engine.MeterModelOutputTokens: p.Usage.OutputTokens} {
						if n > 0 {
							out = append(out, engine.UsageRecord{Sandbox: se.ID, Meter: meter, Start: ev.Time, End: ev.Time, Quantity: float64(n)})
						}
					}
				}
				if len(evs) < 1000 {
					break
				}
				pos = evs[len(evs)-1].Seq + 1
			}
		}
		return out, nil
	}
}
