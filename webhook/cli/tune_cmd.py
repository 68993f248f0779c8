"""``swapwise tune``: each profile's ratio from what its pods really did, read from Prometheus.

The I/O is here: Prometheus' HTTP API (``/api/v1/query``, read-only: no other permission is
needed), the policy file. The queries and the reading of their answers are
:mod:`webhook.analysis.usage`, every decision :mod:`webhook.analysis.tuning`. Exit status 0
with recommendations, 1 when none could be made (Prometheus unreachable or refusing, the
metrics it needs absent: each named, with what to do), never a traceback. docs/tune.md
explains the output.

Prometheus is an upstream like any other (:mod:`webhook.base.upstream`): ``--timeout`` bounds
the whole run, every query and every byte of its answer included; an answer is counted as it
streams, after decompression; what it says (its errors, the pods' profile annotations) is
escaped before it reaches a terminal, and only ever a comment in the YAML patch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
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
    duration,
    missing_metrics,
    probes,
    queries,
    read,
    vector,
)
from webhook.base.documents import DocumentError, decode, load
from webhook.base.files import read_regular
from webhook.base.upstream import (
    BodyLimit,
    BodyTooLarge,
    Deadline,
    DeadlineExceeded,
    comment,
    shown,
)
from webhook.cli.common import CommandError, fail, policy_from

Query = Callable[[str], Awaitable[list[dict[str, Any]]]]
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # one answer of a large cluster, well within
DEFAULT_TIMEOUT = 300.0
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="seconds the whole run may take, every query and its answer "
                             f"included (default {DEFAULT_TIMEOUT:g})")
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


class Prometheus:
    """Instant queries to one Prometheus at one time, each answer bounded as it streams.

    No time limit here: the caller runs every query under one :class:`Deadline`, which
    cancels a query wherever it is (a per-read timeout never fires on an answer that drips).
    """

    def __init__(self, url: str, token_file: str | None, ca_file: str | None, at: float,
                 timeout: float) -> None:
        import httpx2  # only this command talks to Prometheus

        headers = {"Accept": "application/json",
                   # only what httpx2 decodes in bounded pieces (BodyLimit counts those)
                   "Accept-Encoding": "gzip, deflate"}
        if token_file:
            try:
                headers["Authorization"] = "Bearer " + Path(token_file).read_text().strip()
            except OSError as exc:
                raise CommandError(f"--bearer-token-file: {exc.strerror or exc}") from None
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"--prometheus: {shown(url)!r} is not an http:// or https:// "
                               "URL")
        try:
            parsed = httpx2.URL(url)
            if not parsed.host or (parsed.port is not None and not 0 < parsed.port < 65536):
                raise ValueError("no host, or a port out of range")
        except (httpx2.InvalidURL, ValueError) as exc:
            raise CommandError(f"--prometheus: {shown(url)!r} is not a URL: {shown(exc)}"
                               ) from None
        self.url = url
        self.endpoint = url.rstrip("/") + "/api/v1/query"
        self.at = at
        self.malformed = 0  # series of the answers that were not well-formed: left out
        verify: ssl.SSLContext | bool = True
        if ca_file:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except OSError as exc:  # ssl.SSLError too: not a PEM bundle
                raise CommandError(f"--ca-file {shown(ca_file)}: {shown(exc.strerror or exc)}"
                                   ) from None
        self.client = httpx2.AsyncClient(timeout=timeout, headers=headers, verify=verify,
                                         follow_redirects=True)
        self.http_error: type[Exception] = httpx2.HTTPError

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The query's vector: its well-formed elements (the others counted in
        ``malformed``)."""
        where = shown(self.url)
        try:
            async with self.client.stream(
                    "POST", self.endpoint,
                    data={"query": expr, "time": f"{self.at:.3f}"}) as response:
                content = await BodyLimit(MAX_ANSWER_BYTES, "Prometheus' answer").read(
                    response.aiter_bytes())
        except BodyTooLarge as exc:
            raise CommandError(f"{exc}: use a shorter --window") from None
        except self.http_error as exc:
            raise CommandError(f"cannot query Prometheus at {where}: {shown(exc)}") from None
        body, problem = _json(content)
        if response.status_code != 200 or not isinstance(body, dict) \
                or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, dict) else None
            raise CommandError(
                f"Prometheus at {where} answered {response.status_code}"
                + (f": {shown(detail)}" if detail else " without a Prometheus API answer"
                   + (f" ({problem})" if problem else "") + " (is the URL Prometheus' base "
                   "URL?)")
                + ("; a token with access goes in --bearer-token-file"
                   if response.status_code in (401, 403) else ""))
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
            raise CommandError(f"Prometheus at {where} gave an unexpected answer to "
                               f"{shown(expr)!r}")
        if data.get("resultType") != "vector":
            return []
        kept, malformed = vector(data.get("result"))
        self.malformed += malformed
        return kept

    async def close(self) -> None:
        await self.client.aclose()


def _json(content: bytes) -> tuple[Any, str | None]:
    """The answer decoded (orjson: nesting beyond 1024 levels is refused, not recursed
    into), else None and why."""
    try:
        return orjson.loads(content), None
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {shown(exc, 120)}"


async def ask(query: Query, window: str, step: str, rate: str
              ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every answer ``tune`` needs: first whether each source answers at all (an error
    naming what is missing, and what to do, when one does not), then each figure."""
    found = {metric: await query(expr) for metric, expr in probes(window).items()}
    missing = missing_metrics(found)
    if missing:
        raise CommandError("the metrics `tune` reads are not all in Prometheus over the last "
                           f"{window}:\n  " + "\n  ".join(missing))
    return {"probes": found,
            "figures": {name: await query(expr) for name, expr in
                        queries(window, step, rate).items()}}


async def ask_within(prometheus: Prometheus, deadline: Deadline, window: str, step: str,
                     rate: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """:func:`ask`, all of it within ``deadline``; the client closed whatever happens."""
    try:
        return await deadline.run(ask(prometheus.query, window, step, rate))
    finally:
        await prometheus.close()


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
        if not args.timeout > 0:  # also NaN
            raise CommandError(f"--timeout {args.timeout:g}: must be a positive number of "
                               "seconds")
        policy = policy_from(args.policy)
        deadline = Deadline(args.timeout, f"querying Prometheus at {shown(args.prometheus)}")
        prometheus = Prometheus(args.prometheus, args.bearer_token_file, args.ca_file,
                                time.time(), args.timeout)
        header = {"prometheus": args.prometheus, "window": window, "step": step,
                  "rate_interval": rate, "policy": policy.source}
        try:
            answers = asyncio.run(ask_within(prometheus, deadline, window, step, rate))
        except DeadlineExceeded as exc:
            raise CommandError(f"{exc} (--timeout)") from None
        if args.save_answers:
            save(args.save_answers, answers, header)
    except (CommandError, UsageError) as exc:
        return fail(str(exc))
    usage = read(answers["figures"])
    found = recommend(usage.containers, policy, knobs_of(args.policy), args.min_pods,
                      args.min_samples, usage.dropped)
    if prometheus.malformed:
        header["malformed_series"] = prometheus.malformed
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
    lines = [comment(f"swapwise tune: {header['prometheus']}, last {header['window']}, policy "
                     f"{header['policy']}"),
             "# Review, then merge into the policy's profiles (docs/tune.md)."]
    if header.get("malformed_series"):
        lines.append(comment(_malformed(header["malformed_series"])))
    for r in found:
        # The profile may come from a pod's annotation: one comment line whatever it holds.
        lines.append(comment(f"{r.profile}: {r.action}: {'; '.join(r.reasons)}"))
    if not changed:
        return "\n".join([*lines, "profiles: {}", ""])
    for r in changed:  # only the policy's own profiles get a value: DNS labels
        if not _DNS_LABEL.fullmatch(r.profile):
            raise ValueError(f"refusing to write profile {shown(r.profile)!r} as YAML")
    patch = {"profiles": {r.profile: {r.knob: r.recommended_value} for r in changed}}
    return "\n".join(lines) + "\n" + yaml.safe_dump(patch, sort_keys=False)


def _malformed(count: int) -> str:
    return (f"{count} series in Prometheus' answers were not well-formed (labels and a "
            "value as text): left out")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_text(found: list[Recommendation], header: dict[str, Any]) -> None:
    """The table and the reasons; every string from outside (the URL, the policy's path,
    profile names from pods' annotations) escaped."""
    print(shown(f"Prometheus {header['prometheus']}, last {header['window']}, policy "
                f"{header['policy']}", 2000))
    if header.get("malformed_series"):
        print(_malformed(header["malformed_series"]))
    rows = [("PROFILE", "ACTION", "NOW", "RECOMMENDED", "PODS", "WS/REQUEST p95",
             "ABOVE REQUEST", "STALL p95", "STALL PEAK")]
    for r in found:
        e = r.evidence
        now = f"{r.knob} {_knob_now(r)}"
        rows.append((shown(r.profile, 63), r.action, now,
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
            print(f"{shown(r.profile, 63)}: {reason}")


def _knob_now(r: Recommendation) -> str:
    return f"{r.swap_ratio:g}" if r.knob == "swapRatio" else f"{float(r.request_ratio):g}"
