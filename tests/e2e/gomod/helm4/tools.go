//go:build tools

// Package tools pins helm's main package so that `go mod tidy` records its modules in go.sum.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
