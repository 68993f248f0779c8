//go:build tools

// Package tools pins the control plane commands and the real-node kubelet so that
// `go mod tidy` records every module they need in go.sum; build-control-plane.sh builds
// them with `go build`.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
