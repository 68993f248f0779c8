//go:build tools

// Package tools pins Prometheus' and promtool's main packages so that `go mod tidy` records
// their modules in go.sum (tests/e2e/build-prometheus.sh builds them from this module).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
