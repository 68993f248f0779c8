"""``swapwise tune``: each profile's ratio from what its pods really did, read from Prometheus.

The I/O is here: Prometheus' HTTP API (``/api/v1/query``, read-only: no other permission is
needed), the policy file. The queries and the reading of their answers are
:mod:`webhook.analysis.usage`, every decision :mod:`webhook.analysis.tuning`. Exit status 0
with recommendations, 1 when none could be made (Prometheus unreachable or refusing, the
metrics it needs absent: each named, with what to do), never a traceback. docs/tune.md
explains the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from webhook.analysis.tuning import (
    DEFAULT_MIN_PODS,
    DEFAULT_MIN_SAMPLES,
    Knob,
    Recommendation,
    recommend,
)
from webhook.analysis.usage import (
    DEFAULT_RATE_INTERVAL,
    UsageError,
    containers,
    duration,
    missing_metrics,
    probes,
    queries,
)
from webhook.base.documents import DocumentError, decode, load
from webhook.base.files import read_regular
from webhook.cli.common import CommandError, fail, policy_from

Query = Callable[[str], list[dict[str, Any]]]
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # one answer of a large cluster, well within


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "tune",
        help="recommend each profile's swapRatio from its pods' working set, swap use and "
             "memory pressure, as Prometheus recorded them (read-only)",
    )
    parser.add_argument("--prometheus", required=True, metavar="URL",
                        help="Prometheus' base URL, e.g. http://prometheus-operated:9090 "
                             "(kubectl port-forward works)")
    parser.add_argument("--policy", help="the policy the webhook serves (default: built-in)")
    parser.add_argument("--window", default="7d",
                        help="how far back to look, a Prometheus duration (default 7d)")
    parser.add_argument("--step", default="5m",
                        help="resolution of the figures taken over time (default 5m)")
    parser.add_argument("--rate-interval", default=DEFAULT_RATE_INTERVAL,
                        help="the stretch each memory-pressure share is a rate over: at "
                             f"least 4 scrape intervals (default {DEFAULT_RATE_INTERVAL})")
    parser.add_argument("--min-pods", type=int, default=DEFAULT_MIN_PODS,
                        help=f"pods a profile needs for a recommendation "
                             f"(default {DEFAULT_MIN_PODS})")
    parser.add_argument("--min-samples", type=int, default=DEFAULT_MIN_SAMPLES,
                        help=f"working-set samples per container it needs, median "
                             f"(default {DEFAULT_MIN_SAMPLES})")
    parser.add_argument("--bearer-token-file", metavar="FILE",
                        help="send this token (a Prometheus behind an authenticating proxy)")
    parser.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https URL")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per query (default 60)")
    parser.add_argument("--save-answers", metavar="FILE",
                        help="also write every query and Prometheus' answer to FILE (JSON)")
    parser.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text",
                        help="text: a table with the evidence; json: everything; yaml: the "
                             "policy changes, to review and merge")
    parser.set_defaults(func=run)


def knobs_of(path: str | None) -> dict[str, Knob]:
    """Per profile, the knob its policy entry is written with: a recommendation is given in
    it, so merging the YAML output never leaves both (the policy refuses that)."""
    if path is None:
        return {}
    try:
        [document] = load(decode(read_regular(Path(path), 1024 * 1024), path), path)
    except (OSError, DocumentError, ValueError):
        return {}  # policy_from has already read it: cannot happen but for a race
    profiles = document.get("profiles") if isinstance(document, dict) else None
    return {str(name): "requestRatio" if "requestRatio" in (spec or {}) else "swapRatio"
            for name, spec in (profiles or {}).items() if isinstance(spec, dict | None)}


def prometheus(url: str, timeout: float, token_file: str | None, ca_file: str | None,
               at: float) -> Query:
    """A function that runs one instant query at ``at`` and returns its vector."""
    import httpx2  # only this command talks to Prometheus

    headers = {"Accept": "application/json"}
    if token_file:
        try:
            headers["Authorization"] = "Bearer " + Path(token_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"--bearer-token-file: {exc.strerror or exc}") from None
    if not url.startswith(("http://", "https://")):
        raise CommandError(f"--prometheus: {url!r} is not an http:// or https:// URL")
    endpoint = url.rstrip("/") + "/api/v1/query"
    client = httpx2.Client(timeout=timeout, headers=headers, verify=ca_file or True,
                           follow_redirects=True)

    def query(expr: str) -> list[dict[str, Any]]:
        try:
            response = client.post(endpoint, data={"query": expr, "time": f"{at:.3f}"})
        except httpx2.HTTPError as exc:
            raise CommandError(f"cannot query Prometheus at {url}: {exc}") from None
        body = _json(response.content)
        if response.status_code != 200 or not isinstance(body, dict) \
                or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, dict) else None
            raise CommandError(
                f"Prometheus at {url} answered {response.status_code}"
                + (f": {detail}" if detail else " without a Prometheus API answer (is the URL "
                   "Prometheus' base URL?)")
                + ("; a token with access goes in --bearer-token-file"
                   if response.status_code in (401, 403) else ""))
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
            raise CommandError(f"Prometheus at {url} gave an unexpected answer to {expr!r}")
        result = data.get("result")
        return result if isinstance(result, list) else []

    return query


def _json(content: bytes) -> Any:
    if len(content) > MAX_ANSWER_BYTES:
        raise CommandError("Prometheus' answer is larger than 64 MiB: use a shorter --window")
    try:
        return json.loads(content)
    except ValueError:
        return None


def ask(query: Query, window: str, step: str, rate: str
        ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every answer ``tune`` needs: first whether each source answers at all (an error
    naming what is missing, and what to do, when one does not), then each figure."""
    found = {metric: query(expr) for metric, expr in probes(window).items()}
    missing = missing_metrics(found)
    if missing:
        raise CommandError("the metrics `tune` reads are not all in Prometheus over the last "
                           f"{window}:\n  " + "\n  ".join(missing))
    return {"probes": found,
            "figures": {name: query(expr) for name, expr in
                        queries(window, step, rate).items()}}


def save(path: str, answers: dict[str, Any], header: dict[str, Any]) -> None:
    """The queries' answers as JSON: what a recommendation rested on, for a bug report."""
    try:
        Path(path).write_text(json.dumps(header | answers, indent=1) + "\n")
    except OSError as exc:
        raise CommandError(f"--save-answers {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        window = duration(args.window, "--window")
        step = duration(args.step, "--step")
        rate = duration(args.rate_interval, "--rate-interval")
        if args.min_pods < 1 or args.min_samples < 1:
            raise CommandError("--min-pods and --min-samples must be at least 1")
        policy = policy_from(args.policy)
        query = prometheus(args.prometheus, args.timeout, args.bearer_token_file,
                           args.ca_file, time.time())
        header = {"prometheus": args.prometheus, "window": window, "step": step,
                  "rate_interval": rate, "policy": policy.source}
        answers = ask(query, window, step, rate)
        if args.save_answers:
            save(args.save_answers, answers, header)
    except (CommandError, UsageError) as exc:
        return fail(str(exc))
    found = recommend(containers(answers["figures"]), policy, knobs_of(args.policy),
                      args.min_pods, args.min_samples)
    if args.output == "json":
        json.dump(header | {"recommendations": [r.as_dict() for r in found]}, sys.stdout,
                  indent=2)
        print()
    elif args.output == "yaml":
        print(as_policy_patch(found, header), end="")
    else:
        print_text(found, header)
    return 0


def as_policy_patch(found: list[Recommendation], header: dict[str, Any]) -> str:
    """The changes as a policy fragment (``profiles.NAME.<knob>``), each with why in a
    comment: reviewed, then merged into the policy file by hand or by a values overlay."""
    changed = [r for r in found if r.recommended_value is not None]
    lines = [f"# swapwise tune: {header['prometheus']}, last {header['window']}, policy "
             f"{header['policy']}",
             "# Review, then merge into the policy's profiles (docs/tune.md)."]
    for r in found:
        lines.append(f"# {r.profile}: {r.action}: {'; '.join(r.reasons)}")
    if not changed:
        return "\n".join([*lines, "profiles: {}", ""])
    patch = {"profiles": {r.profile: {r.knob: r.recommended_value} for r in changed}}
    return "\n".join(lines) + "\n" + yaml.safe_dump(patch, sort_keys=False)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_text(found: list[Recommendation], header: dict[str, Any]) -> None:
    print(f"Prometheus {header['prometheus']}, last {header['window']}, policy "
          f"{header['policy']}")
    rows = [("PROFILE", "ACTION", "NOW", "RECOMMENDED", "PODS", "WS/REQUEST p95",
             "ABOVE REQUEST", "STALL p95", "STALL PEAK")]
    for r in found:
        e = r.evidence
        now = f"{r.knob} {_knob_now(r)}"
        rows.append((r.profile, r.action, now,
                     "-" if r.recommended_value is None else f"{r.knob} {r.recommended_value:g}",
                     str(e.pods), _share(e.working_set_over_request_p95),
                     _share(e.above_request_share), _share(e.stall_share_p95),
                     _share(e.stall_peak_p95)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                 strict=True)).rstrip())
    for r in found:
        for reason in r.reasons:
            print(f"{r.profile}: {reason}")


def _knob_now(r: Recommendation) -> str:
    return f"{r.swap_ratio:g}" if r.knob == "swapRatio" else f"{float(r.request_ratio):g}"
