"""Record what a real kube-apiserver stores under the rendered admission policies: the golden
outputs the unit tier checks the engine and the renderer against
(tests/render/test_admission_policy_golden.py).

Why: the CEL of `swapwise render admission-policy` is proven equal to the engine on a real
API server by tests/e2e/test_admission_policy.py, which needs the 1.37 control plane. The
policies' JSONPatch and library functions are the API server's own, so no CEL interpreter
in Python can stand in for it; recording what the API server did, once, lets every unit run
check the engine against it, and a renderer changed without a new recording fails there.

Every case of the equivalence test (tests/e2e/admission_cases.py: the engine's table cases
and the drawn pods and profiles) is created with ``dryRun=All`` twice: in a namespace no
policy serves (the pod as admission receives it: defaulted, with the built-in plugins'
changes) and in one the profile's rendered policies serve. Both stored forms are written,
the second as a JSON Patch from the first, with the policies' warnings.

    make admission-policy-golden    # python -m tests.e2e.record_cel_golden [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonpatch

from testkit.golden import GOLDEN, rendered_digest
from tests.e2e.admission_api import (
    API_VERSION,
    LINE,
    api,
    create_all,
    create_pod,
    policy_control_plane,
)
from tests.e2e.admission_cases import (
    WARN_PREFIX,
    all_cases,
    pod_for,
    policy_document,
    probe_pod,
    stored,
)
from tests.e2e.cluster import PROFILE_LABEL
from webhook.policy import build_policy
from webhook.render.admission_policy import render_admission_policies

PLAIN = "plain"  # the namespace no policy serves


def record(out: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        named, cases = all_cases(Path(tmp))
    document = policy_document(named)
    policy = build_policy(document)
    objects = render_admission_policies(policy, API_VERSION, failure_policy="Fail")
    recorded: list[dict[str, Any]] = []
    with policy_control_plane() as cp:
        version = api(cp, "GET", "/version")[1]["gitVersion"]
        create_all(cp, objects)
        cp.create_namespace(PLAIN, {})
        for name in named:
            cp.create_namespace(f"policy-{name}", {PROFILE_LABEL: name})
        for name, profile in named.items():  # every policy live: a probe comes back mutated
            def mutated(ns: str = f"policy-{name}", p: Any = profile) -> bool:
                status, body, _ = create_pod(cp, ns, probe_pod(p), dry_run=True)
                annotations = body.get("metadata", {}).get("annotations") or {}
                return status == 201 and annotations.get(PROFILE_LABEL) == p.name
            cp.wait_for(mutated, 60, what=f"the policies of profile {name}")
        for i, case in enumerate(cases):
            pod = pod_for(case, f"case-{i}")
            status, body, _ = create_pod(cp, PLAIN, pod, dry_run=True)
            entry: dict[str, Any] = {"id": case.id, "profile": case.profile,
                                     "admitted": stored(status, body)}
            status, body, warnings = create_pod(cp, f"policy-{case.profile}", pod,
                                                dry_run=True)
            result = stored(status, body)
            if status < 300 and "refused" not in entry["admitted"]:
                entry["policy_patch"] = jsonpatch.make_patch(entry["admitted"], result).patch
            else:
                entry["policy"] = result
            entry["warnings"] = [WARN_PREFIX.sub("", w, count=1) for w in warnings]
            recorded.append(entry)
            if i % 100 == 0:
                print(f"record: {i} of {len(cases)} cases", file=sys.stderr, flush=True)
    header = {"line": LINE, "apiVersion": API_VERSION, "kubeApiserver": version,
              "renderedSha256": rendered_digest(objects), "policy": document}
    # One case a line: a new recording reads as a diff of the cases that changed.
    lines = [json.dumps(entry, sort_keys=True) for entry in recorded]
    out.write_text('{"header": ' + json.dumps(header, sort_keys=True) + ',\n"cases": [\n'
                   + ",\n".join(lines) + "\n]}\n")
    print(f"record: {len(recorded)} cases from {version} written to {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=GOLDEN)
    return record(parser.parse_args(argv).out)


if __name__ == "__main__":
    raise SystemExit(main())
