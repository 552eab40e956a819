// Package obs is observability: traces (internal/obs/tracing), structured
// logs (internal/obs/logging) and Prometheus metrics (internal/obs/metrics,
// which reads the metadata store for its gauges).
//
// May import: core, lib, internal/state/meta.
package obs
