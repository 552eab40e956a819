// Package metrics declares every Prometheus metric Amber exports, in one
// place, and the collectors that fill them. The daemon serves them at
// /metrics (the operator's key).
//
//	amber_sandboxes{state}                      gauge, read from the metadata store at each scrape
//	amber_checkpoints_total{driver,outcome}     counter
//	amber_checkpoint_frozen_seconds{driver}     histogram: how long the sandbox could not run
//	amber_checkpoint_seconds{driver}            histogram: the whole checkpoint, upload included
//	amber_checkpoint_stored_bytes_total{tenant} counter: bytes added to the store (after dedup)
//	amber_restores_total{driver,outcome}        counter
//	amber_restore_seconds{driver}               histogram: fetch, verify and restore
//	amber_log_append_seconds                    histogram: durable appends to the event log
//	amber_http_requests_total{route,code}       counter
//	amber_http_request_seconds{route}           histogram
//	amber_quota_rejections_total{tenant,quota}  counter: calls refused by a tenant quota (429)
//	amber_usage_total{tenant,meter}             counter: usage recorded by metering (engine/metering.go), in the meter's unit
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/meta"
)

// Metrics holds Amber's metrics on their own registry.
type Metrics struct {
	reg *prometheus.Registry

	checkpoints   *prometheus.CounterVec
	frozen        *prometheus.HistogramVec
	ckptSeconds   *prometheus.HistogramVec
	storedBytes   *prometheus.CounterVec
	restores      *prometheus.CounterVec
	restoreSecs   *prometheus.HistogramVec
	appendSeconds prometheus.Histogram
	httpRequests  *prometheus.CounterVec
	httpSeconds   *prometheus.HistogramVec
	quotaRejected *prometheus.CounterVec
	usage         *prometheus.CounterVec
	egress        *prometheus.CounterVec
}

// durations from 1 ms to ~1 min.
var secondsBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 13)

// New declares the metrics; m (may be nil) is read at each scrape for the
// sandbox counts.
func New(m metadata.Sandboxes) *Metrics {
	x := &Metrics{reg: prometheus.NewRegistry()}
	x.checkpoints = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_checkpoints_total", Help: "Checkpoints attempted, by driver and outcome (ok or the error kind)."}, []string{"driver", "outcome"})
	x.frozen = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "amber_checkpoint_frozen_seconds", Help: "How long a checkpoint kept the sandbox from running.", Buckets: secondsBuckets}, []string{"driver"})
	x.ckptSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "amber_checkpoint_seconds", Help: "Checkpoint duration, upload and commit included.", Buckets: secondsBuckets}, []string{"driver"})
	x.storedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_checkpoint_stored_bytes_total", Help: "Bytes checkpoints added to the blob store after deduplication and compression."}, []string{"tenant"})
	x.restores = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_restores_total", Help: "Restores attempted, by driver and outcome."}, []string{"driver", "outcome"})
	x.restoreSecs = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "amber_restore_seconds", Help: "Restore duration: fetch, verify, driver restore.", Buckets: secondsBuckets}, []string{"driver"})
	x.appendSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "amber_log_append_seconds", Help: "Durable appends to the event log.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)})
	x.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_http_requests_total", Help: "API requests by route and status code."}, []string{"route", "code"})
	x.httpSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "amber_http_request_seconds", Help: "API request duration by route.", Buckets: secondsBuckets}, []string{"route"})
	x.quotaRejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_quota_rejections_total", Help: "Calls refused by a tenant quota, by tenant and quota (max_sandboxes, max_memory_bytes, max_millicpus, max_checkpoint_bytes, requests_per_second)."}, []string{"tenant", "quota"})
	x.usage = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_usage_total", Help: "Usage recorded in the tenants' usage streams, by tenant and meter, in the meter's unit (cpu_seconds, memory_gib_seconds, egress_requests, egress_bytes, checkpoints, restores, checkpoint_storage_gib_hours)."}, []string{"tenant", "meter"})
	x.egress = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "amber_gateway_decisions_total", Help: "Egress gateway decisions by tenant and kind: forward, replay (answered from the effect journal, upstream not contacted), deny, rate-limited, fenced, reconcile, divergence, stream, error."}, []string{"tenant", "kind"})
	x.reg.MustRegister(x.egress, x.usage, x.quotaRejected, x.checkpoints, x.frozen, x.ckptSeconds, x.storedBytes, x.restores, x.restoreSecs, x.appendSeconds,
		x.httpRequests, x.httpSeconds, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if m != nil {
		x.Sandboxes(m)
	}
	return x
}

// Sandboxes makes scrapes count m's sandboxes by state (once).
func (x *Metrics) Sandboxes(m metadata.Sandboxes) { x.reg.MustRegister(&sandboxCollector{meta: m}) }

// Handler serves the metrics in Prometheus's text format.
func (x *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(x.reg, promhttp.HandlerOpts{})
}

func outcome(kind string) string {
	if kind == "" {
		return "ok"
	}
	return kind
}

// Checkpoint records one checkpoint; kind is "" on success, else the
// error's kind.
func (x *Metrics) Checkpoint(driver, tenant, kind string, frozen, total time.Duration, stored int64) {
	x.checkpoints.WithLabelValues(driver, outcome(kind)).Inc()
	if kind == "" {
		x.frozen.WithLabelValues(driver).Observe(frozen.Seconds())
		x.ckptSeconds.WithLabelValues(driver).Observe(total.Seconds())
		x.storedBytes.WithLabelValues(tenant).Add(float64(stored))
	}
}

// Restore records one restore.
func (x *Metrics) Restore(driver, kind string, d time.Duration) {
	x.restores.WithLabelValues(driver, outcome(kind)).Inc()
	if kind == "" {
		x.restoreSecs.WithLabelValues(driver).Observe(d.Seconds())
	}
}

// Request records one API request.
func (x *Metrics) Request(route string, code int, d time.Duration) {
	x.httpRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	x.httpSeconds.WithLabelValues(route).Observe(d.Seconds())
}

// QuotaRejected counts one call refused by tenant's quota (the
// meta.TenantQuota field name); it makes Metrics an engine.QuotaObserver.
func (x *Metrics) QuotaRejected(tenant, quota string) {
	x.quotaRejected.WithLabelValues(tenant, quota).Inc()
}

// UsageRecorded counts usage metering appended for tenant; it makes
// Metrics an engine.UsageObserver.
func (x *Metrics) UsageRecorded(tenant, meter string, quantity float64) {
	x.usage.WithLabelValues(tenant, meter).Add(quantity)
}

// sandboxCollector counts sandboxes by state from the metadata store.
type sandboxCollector struct{ meta metadata.Sandboxes }

var sandboxesDesc = prometheus.NewDesc("amber_sandboxes", "Sandboxes by lifecycle state (pooled ones included, destroyed ones not).", []string{"state"}, nil)

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.meta.List(ctx, meta.Filter{})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	n := map[meta.State]int{}
	for _, st := range []meta.State{meta.StateCreating, meta.StateRestoring, meta.StateRunning, meta.StateStopped, meta.StateCrashed} {
		n[st] = 0
	}
	for _, sb := range rows {
		n[sb.State]++
	}
	for st, v := range n {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(v), string(st))
	}
}

// Log wraps an event log so that appends are timed. The wrapper keeps the
// store's Notifier power if it has it (subscribers rely on it).
func (x *Metrics) Log(s eventlog.Store) eventlog.Store {
	t := &timedLog{Store: s, h: x.appendSeconds}
	if n, ok := s.(eventlog.Notifier); ok {
		return &timedNotifyingLog{timedLog: t, n: n}
	}
	return t
}

type timedLog struct {
	eventlog.Store
	h prometheus.Histogram
}

func (l *timedLog) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	start := time.Now()
	res, err := l.Store.Append(ctx, stream, epoch, expectedSeq, events...)
	if err == nil {
		l.h.Observe(time.Since(start).Seconds())
	}
	return res, err
}

type timedNotifyingLog struct {
	*timedLog
	n eventlog.Notifier
}

func (l *timedNotifyingLog) Changed(stream string) <-chan struct{} { return l.n.Changed(stream) }

// GatewayDecision counts one egress gateway decision (kind: forward,
// replay, deny, …).
func (x *Metrics) GatewayDecision(tenant, kind string) {
	x.egress.WithLabelValues(tenant, kind).Inc()
}
