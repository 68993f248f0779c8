//go:build tools

// Package tools pins gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) so
// that go.sum records every module they need; build-gvisor.sh builds them with `go build`.
//
// The version is the last commit of gVisor's go-gettable "go" branch whose shim still links
// containerd 1.6's shim library: later ones (containerd/v2) answer containerd's start with
// the JSON bootstrap of containerd 2, which the guest's Debian containerd 1.6 cannot parse.
package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
