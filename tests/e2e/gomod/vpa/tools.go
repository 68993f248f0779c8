//go:build tools

// Package tools pins the VPA admission controller's and updater's main packages so that
// `go mod tidy` records their modules in go.sum (tests/e2e/build-vpa.sh builds them from this module).
package tools

import (
	_ "k8s.io/autoscaler/vertical-pod-autoscaler/pkg/admission-controller"
	_ "k8s.io/autoscaler/vertical-pod-autoscaler/pkg/updater"
)
