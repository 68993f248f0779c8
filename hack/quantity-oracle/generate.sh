#!/bin/sh
# Regenerate tests/data/quantity_table.json: Kubernetes' own answer (resource.ParseQuantity,
# k8s.io/apimachinery v0.34.4) for every case of testkit/quantity_grammar.py. Offline: needs Go
# and the module in the Go module cache (make control-plane puts it there).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/go-env.sh"
[ -d "$GOMODCACHE/k8s.io/apimachinery@v0.34.4" ] || GOMODCACHE=$HOME/go/pkg/mod
export GOMODCACHE GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
(cd "$here" && go build -o "$build/oracle" .)
cd "$root"
"${PYTHON:-.venv/bin/python}" -c '
import json
from testkit.quantity_grammar import cases
for case in cases():
    print(json.dumps(case))
' | "$build/oracle" | "${PYTHON:-.venv/bin/python}" -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin]
print("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]")
' > tests/data/quantity_table.json
echo "wrote tests/data/quantity_table.json"
