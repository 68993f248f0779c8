"""``swapwise render admission-policy``: the policy file as built-in admission policies.

Thin: the objects come from :mod:`webhook.render.admission_policy`; this reads the policy,
prints YAML (the objects, or with ``--format helm-values`` a values file for the chart's
``mode: admissionPolicy``), and refuses (exit 1, nothing printed) a policy CEL cannot express.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from webhook.cli.common import CommandError, fail, policy_from
from webhook.engine.selection import ALWAYS_EXCLUDED_NAMESPACES
from webhook.render.admission_policy import (
    API_VERSIONS,
    Unrenderable,
    helm_values,
    render_admission_policies,
)

FORMATS = ("yaml", "helm-values")
# Heads the values file: what it is and how to use it (no date, so re-rendering an unchanged
# policy gives the same bytes, as GitOps wants).
HELM_VALUES_HEADER = """\
# swapwise: values for charts/swapwise in mode admissionPolicy (no webhook), written by
# `swapwise render admission-policy --format helm-values`. Do not edit: change the policy
# file, render again and upgrade. Install with:
#   helm upgrade --install swapwise charts/swapwise -n swapwise --create-namespace -f THIS_FILE
"""


class _NoAliases(yaml.SafeDumper):
    """Writes shared dicts out in full: a values file people read and diff has no &id001."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser("render", help="render the policy as other objects")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    ap = kinds.add_parser(
        "admission-policy",
        help="MutatingAdmissionPolicy + ValidatingAdmissionPolicy (Warn) per profile: "
             "swapwise without a webhook (docs/admission-policy.md)",
    )
    ap.add_argument("--policy", metavar="FILE", help="policy file (default: built-in policy)")
    ap.add_argument("--api-version", choices=API_VERSIONS, default="v1",
                    help="admissionregistration.k8s.io version of the mutating policy: v1 "
                         "(Kubernetes >= 1.36) or v1beta1 (1.34-1.35, feature gate) "
                         "(default v1)")
    ap.add_argument("--failure-policy", choices=("Ignore", "Fail"), default="Ignore",
                    help="what the API server does when the CEL fails (default Ignore, as "
                         "the chart's webhook)")
    ap.add_argument("--exclude-namespace", action="append", metavar="NS", default=None,
                    help="namespace never mutated, repeatable (default: "
                         f"{', '.join(ALWAYS_EXCLUDED_NAMESPACES)})")
    ap.add_argument("--format", choices=FORMATS, default="yaml",
                    help="yaml: the objects, for kubectl apply; helm-values: a values file "
                         "for charts/swapwise (mode: admissionPolicy, the objects under "
                         "admissionPolicy.objects) (default yaml)")
    ap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        policy = policy_from(args.policy)
        excluded = tuple(args.exclude_namespace or ALWAYS_EXCLUDED_NAMESPACES)
        objects = render_admission_policies(policy, args.api_version, args.failure_policy,
                                            excluded)
    except CommandError as exc:
        return fail(str(exc))
    except Unrenderable as exc:
        return fail(str(exc))
    if args.format == "helm-values":
        sys.stdout.write(HELM_VALUES_HEADER
                         + yaml.dump(helm_values(objects), Dumper=_NoAliases,
                                     sort_keys=False, width=100))
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return 0
