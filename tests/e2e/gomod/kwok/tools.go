//go:build tools

// Package tools pins kwok's controller command so that `go mod tidy` records its modules in
// go.sum (tests/e2e/build-karpenter.sh builds it from this module).
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
