//go:build tools

// Helper module: builds kube-state-metrics for the `swapwise tune` tests (the pods' memory
// requests and their swapwise.io/profile annotation, as users' clusters export them).
package tools

import _ "k8s.io/kube-state-metrics/v2"
