//go:build tools

// Package tools pins Karpenter's kwok provider (a main package in the sigs.k8s.io/karpenter
// module, kwok/main.go) so that `go mod tidy` records its modules in go.sum
// (tests/e2e/build-karpenter.sh builds it from this module).
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
