"""``swapwise tune`` on recorded Prometheus answers: reading them, deciding, the command.

``tests/data/tune/backfill.json`` is what a real Prometheus (3.16, tests/e2e/test_tune.py's
set-up) answered ``tune --save-answers`` over an hour of kube-state-metrics and cAdvisor
series (testkit/tune_history.py): calm, hot and thin profiles, a pod in a namespace that
overrides its profile, a pod without the annotation, a NaN swap sample and a container that
restarted (its PSI counter from 0). ``node-*.json`` are the real swap node's answers
(tests/node, ``make node-e2e``). The real Prometheus itself is tests/e2e/test_tune.py's.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from webhook.analysis import tuning
from webhook.analysis.tuning import Evidence, decide, recommend
from webhook.analysis.usage import (
    PROBES,
    UsageError,
    containers,
    duration,
    missing_metrics,
    probes,
    queries,
)
from webhook.cli import main
from webhook.policy import build_policy, load_policy

DATA = Path(__file__).parents[1] / "data" / "tune"
POLICY = DATA / "policy.yaml"


def recorded(name: str) -> dict[str, Any]:
    answers: dict[str, Any] = json.loads((DATA / name).read_text())
    return answers


def by_profile(found: list[tuning.Recommendation]) -> dict[str, tuning.Recommendation]:
    return {r.profile: r for r in found}


# --------------------------------------------------------------------------- reading answers


def test_recorded_answers_give_one_row_per_container_of_a_reshaped_pod() -> None:
    found = containers(recorded("backfill.json")["figures"])
    pods = {(c.namespace, c.pod) for c in found}
    assert len(found) == len(pods) == 10
    assert ("plain", "not-reshaped") not in pods  # no profile annotation: not reshaped
    assert {c.profile for c in found} == {"calm", "hot", "thin"}
    restarted = next(c for c in found if c.pod == "hot-0")
    # Its PSI counter restarted from 0 halfway: rate() keeps the share of time, 30 %.
    assert restarted.stall == pytest.approx(0.30, abs=0.02)
    nan_swap = next(c for c in found if c.pod == "calm-1")
    assert nan_swap.swap_max == pytest.approx(100 * 1024 * 1024)


def test_empty_answers_name_every_source_and_what_to_do() -> None:
    missing = missing_metrics({})
    assert [line.split(":")[0] for line in missing] == list(PROBES)
    assert any("--metric-annotations-allowlist=pods=[swapwise.io/profile]" in m
               for m in missing)
    assert any("/metrics/cadvisor" in m for m in missing)
    assert any("KubeletPSI" in m for m in missing)
    assert containers({}) == []


def test_one_missing_source_is_named_alone() -> None:
    probes_ = recorded("backfill.json")["probes"]
    assert missing_metrics(probes_) == []
    without = {**probes_, "kube_pod_annotations": []}
    [line] = missing_metrics(without)
    assert line.startswith("kube_pod_annotations:")


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "x", None])
def test_values_that_are_no_number_are_left_out(value: Any) -> None:
    figures = copy.deepcopy(recorded("backfill.json")["figures"])
    for result in figures["working_set_p95"]:
        if result["metric"]["pod"] == "calm-0":
            result["value"] = [result["value"][0], value]
    for result in figures["stall"]:
        if result["metric"]["pod"] == "calm-2":
            result["value"] = [result["value"][0], value]
    found = {c.pod: c for c in containers(figures)}
    assert "calm-0" not in found  # no working set: nothing to judge it by
    assert found["calm-2"].stall is None
    assert len(found) == 9


@pytest.mark.parametrize("junk", [
    [{"value": [0, "1"]}],  # no labels
    [{"metric": "x", "value": [0, "1"]}],
    ["not an object"],
    [{"metric": {"namespace": "a", "pod": "b"}, "value": [0, "1"]}],  # no container
])
def test_malformed_results_are_skipped(junk: list[Any]) -> None:
    figures = copy.deepcopy(recorded("backfill.json")["figures"])
    for name in figures:
        figures[name] = figures[name] + junk
    assert len(containers(figures)) == 10


def test_partial_answers_leave_figures_out_and_decide_without_them() -> None:
    figures = copy.deepcopy(recorded("backfill.json")["figures"])
    figures.pop("limit")
    figures.pop("swap_max")
    found = containers(figures)
    assert all(c.limit is None and c.swap_max is None for c in found)
    decided = by_profile(recommend(found, load_policy(POLICY), {"hot": "requestRatio"}))
    # Without limits the profile's own ratio is the base; the verdicts stand.
    assert decided["hot"].action == "lower"
    assert decided["calm"].action == "raise"


def test_without_pressure_figures_nothing_is_recommended() -> None:
    figures = copy.deepcopy(recorded("backfill.json")["figures"])
    figures["stall"] = []
    figures["stall_peak"] = []
    decided = recommend(containers(figures), load_policy(POLICY), {})
    assert {r.action for r in decided} == {"insufficient-data"}
    assert all(any("PSI" in reason for reason in r.reasons) for r in decided)


def test_queries_name_the_window_and_step() -> None:
    found = queries("7d", "5m", "2m")
    assert all("[7d" in expr for expr in found.values())
    assert "[7d:5m]" in found["above_request"] and "[7d:5m]" in found["stall_peak"]
    assert "[2m]" in found["stall"] and "[2m]" in found["stall_peak"]
    assert all("[7d]" in expr for expr in probes("7d").values())


@pytest.mark.parametrize("text", ["7d", "1h30m", "90s", "2w"])
def test_durations_prometheus_reads(text: str) -> None:
    assert duration(text, "--window") == text


@pytest.mark.parametrize("text", ["", "7", "7x", "0d", "-1h", "1 h", "7d]", 'x"'])
def test_durations_it_does_not(text: str) -> None:
    with pytest.raises(UsageError, match="--window"):
        duration(text, "--window")


# --------------------------------------------------------------------------- deciding


def test_recorded_profiles_get_the_documented_verdicts() -> None:
    policy = load_policy(POLICY)
    found = by_profile(recommend(containers(recorded("backfill.json")["figures"]), policy,
                                 {"calm": "swapRatio", "hot": "requestRatio"}))
    calm, hot, thin = found["calm"], found["hot"], found["thin"]
    assert calm.action == "raise" and calm.recommended_swap_ratio > calm.swap_ratio
    assert calm.evidence.pods == 4 and calm.evidence.in_overridden_namespaces == 1
    assert any("override" in r for r in calm.reasons)
    assert hot.action == "lower"
    assert hot.recommended_request_ratio is not None
    assert hot.recommended_request_ratio > hot.request_ratio
    assert hot.knob == "requestRatio" and hot.recommended_value == float(
        hot.recommended_request_ratio)
    assert thin.action == "insufficient-data" and thin.recommended_request_ratio is None


def test_the_real_nodes_calm_pods_are_kept() -> None:
    """The density run's 19 pods (tests/node, 2026-12-05): hot sets within the requests, the
    working set above them while the node had RAM to spare, no waiting: keep."""
    policy = load_policy(DATA / "node-policy.yaml")
    found = by_profile(recommend(containers(recorded("node-calm.json")["figures"]), policy,
                                 {}, min_samples=6))
    sandbox = found["sandbox"]
    assert sandbox.action == "keep" and sandbox.evidence.pods == 19
    assert "RAM to spare" in sandbox.reasons[0]


def test_the_real_nodes_cpu_limited_hot_pods_show_little_waiting() -> None:
    """The limit docs/tune.md states ("On a real swap node"): 19 sandboxes with 110 MiB hot
    against 85 MiB requests, held to 50m of CPU each, the node's PSI `some` near 22 %: each
    container waited for memory well under 1 % of the wall-clock time, so tune keeps. The same
    pods without a CPU limit give "lower" (the real-node suite, and the recording below). If
    the stall share is ever weighed against CPU time, this recording must give "lower"."""
    policy = load_policy(DATA / "node-policy.yaml")
    found = by_profile(recommend(containers(recorded("node-hot.json")["figures"]), policy,
                                 {}, min_samples=6))["tuned"]
    assert found.evidence.pods == 19
    assert found.evidence.working_set_over_request_p95 is not None
    assert found.evidence.working_set_over_request_p95 > 1.2
    assert found.evidence.stall_share_p95 is not None and found.evidence.stall_share_p95 < 0.01
    assert found.action == "keep"


def evidence(**figures: Any) -> Evidence:
    base = dict(pods=10, containers=10, samples_median=100, working_set_over_request_p95=1.0,
                above_request_share=0.5, stall_share_p95=0.3, stall_peak_p95=0.4,
                observed_request_ratio=1 / 3)
    return Evidence(**(base | figures))


THIRD = Fraction(1, 3)


def test_stalling_while_pressed_lowers_by_working_set_and_stall() -> None:
    found = decide("p", THIRD, "requestRatio", evidence())
    assert found.action == "lower"
    # 1/3 x 1.0 x (1 + 0.25 + 0.3), rounded up to hundredths
    assert found.recommended_request_ratio == Fraction(52, 100)


def test_a_swap_ratio_is_given_to_a_tenth_rounded_toward_the_larger_request() -> None:
    found = decide("p", THIRD, "swapRatio", evidence())
    assert found.recommended_value == 0.9  # (1 - 0.52) / 0.52 = 0.92
    assert found.recommended_request_ratio == 1 / (1 + Fraction(9, 10))


def test_stalling_within_the_request_keeps_and_says_why() -> None:
    found = decide("p", THIRD, "swapRatio",
                   evidence(working_set_over_request_p95=tuning.PRESSED - 0.01))
    assert found.action == "keep"
    assert "other reasons" in found.reasons[0]


def test_pressed_but_not_stalling_keeps() -> None:
    found = decide("p", THIRD, "swapRatio",
                   evidence(stall_share_p95=tuning.STALLING - 0.001, stall_peak_p95=0.2))
    assert found.action == "keep"
    assert "too little to act on" in found.reasons[0]


def test_a_working_set_above_the_request_without_waiting_keeps_and_says_why() -> None:
    found = decide("p", THIRD, "swapRatio", evidence(
        working_set_over_request_p95=1.35, stall_share_p95=0.0, stall_peak_p95=0.0))
    assert found.action == "keep"
    assert "RAM to spare" in found.reasons[0]


def test_pods_that_ran_with_smaller_requests_than_the_profile_gives_now_are_not_judged() -> None:
    # They ran at a tenth of the limit; the profile now asks for two thirds.
    found = decide("p", Fraction(2, 3), "requestRatio", evidence(observed_request_ratio=0.1))
    assert found.action == "keep"
    assert "judge again" in found.reasons[0]


def test_calm_and_roomy_raises() -> None:
    found = decide("p", THIRD, "swapRatio", evidence(
        working_set_over_request_p95=0.5, above_request_share=0.0, stall_share_p95=0.0,
        stall_peak_p95=0.0))
    assert found.action == "raise"
    assert found.recommended_request_ratio is not None
    assert found.recommended_request_ratio < THIRD
    assert any("swapwise plan" in r for r in found.reasons)


@pytest.mark.parametrize("figures", [
    {"stall_peak_p95": tuning.CALM_PEAK},  # one bad stretch
    {"above_request_share": tuning.SELDOM + 0.01},
    {"working_set_over_request_p95": tuning.ROOMY + 0.01},
    {"stall_share_p95": tuning.CALM},
])
def test_calm_is_not_raised_on_any_doubt(figures: dict[str, float]) -> None:
    quiet = dict(working_set_over_request_p95=0.5, above_request_share=0.0,
                 stall_share_p95=0.0, stall_peak_p95=0.0)
    assert decide("p", THIRD, "swapRatio", evidence(**(quiet | figures))).action == "keep"


def test_a_small_raise_is_a_keep() -> None:
    # 1/3 x 0.78 x 1.25 = 0.325: within 10 % of 1/3
    found = decide("p", THIRD, "requestRatio", evidence(
        working_set_over_request_p95=0.78, above_request_share=0.0, stall_share_p95=0.0,
        stall_peak_p95=0.0))
    assert found.action == "keep"


def test_lowering_stops_short_of_the_limit_and_says_so() -> None:
    found = decide("p", THIRD, "requestRatio",
                   evidence(working_set_over_request_p95=2.5, stall_share_p95=0.9))
    assert found.action == "lower"
    assert found.recommended_request_ratio == tuning.MAX_REQUEST_RATIO
    assert any("podSelector" in r for r in found.reasons)


@pytest.mark.parametrize("figures", [{"pods": 2}, {"samples_median": 9},
                                     {"stall_share_p95": None}])
def test_thin_data_recommends_nothing(figures: dict[str, Any]) -> None:
    found = decide("p", THIRD, "swapRatio", evidence(**figures))
    assert found.action == "insufficient-data"
    assert found.recommended_request_ratio is None and found.reasons


def test_profiles_on_pods_but_not_in_the_policy_are_reported() -> None:
    policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"calm": {"swapRatio": 2}}})
    found = by_profile(recommend(containers(recorded("backfill.json")["figures"]), policy, {}))
    assert found["hot"].action == "insufficient-data"
    assert "does not have" in found["hot"].reasons[0]


# --------------------------------------------------------------------------- the command


class Recorded(http.server.BaseHTTPRequestHandler):
    """Answers /api/v1/query from a recording, as Prometheus would (a stand-in for the
    command's plumbing; the real Prometheus is tests/e2e/test_tune.py's)."""

    answers: ClassVar[dict[str, list[Any]]] = {}
    status = 200

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        expr = form["query"][0]
        result = self.answers.get(expr)
        if self.status != 200:
            body = {"status": "error", "errorType": "bad_data", "error": "boom"}
        elif result is None:
            body = {"status": "error", "errorType": "bad_data", "error": f"unknown {expr}"}
        else:
            body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        data = json.dumps(body).encode()
        self.send_response(self.status if result is not None or self.status != 200 else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[type[Recorded]]:
    saved = recorded("backfill.json")
    window = saved["window"]
    handler = type("Handler", (Recorded,), {})
    handler.answers = {
        **{expr: saved["probes"][m] for m, expr in probes(window).items()},
        **{expr: saved["figures"][n] for n, expr in
           queries(window, saved["step"], saved["rate_interval"]).items()},
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()


def tune(prometheus: type[Recorded], *args: str) -> list[str]:
    saved = recorded("backfill.json")
    return ["tune", "--prometheus", prometheus.url,  # type: ignore[attr-defined]
            "--window", saved["window"], "--step", saved["step"],
            "--rate-interval", saved["rate_interval"], *args]


def test_json_output_carries_each_recommendation_and_its_evidence(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(tune(prometheus, "--policy", str(POLICY), "-o", "json")) == 0
    report = json.loads(capsys.readouterr().out)
    found = {r["profile"]: r for r in report["recommendations"]}
    assert found["hot"]["action"] == "lower" and found["hot"]["knob"] == "requestRatio"
    assert found["calm"]["evidence"]["pods"] == 4


def test_text_output_is_a_table_with_the_reasons(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(tune(prometheus, "--policy", str(POLICY))) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["PROFILE", "ACTION", "NOW"]
    assert "hot: hot memory exceeds the request" in out


def test_yaml_output_merged_into_the_policy_gives_the_recommended_ratios(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    assert main(tune(prometheus, "--policy", str(POLICY), "-o", "json")) == 0
    wanted = {r["profile"]: r for r in json.loads(capsys.readouterr().out)["recommendations"]}
    assert main(tune(prometheus, "--policy", str(POLICY), "-o", "yaml")) == 0
    patch = yaml.safe_load(capsys.readouterr().out)
    assert set(patch["profiles"]) == {"calm", "hot"}  # thin: no recommendation
    document = yaml.safe_load(POLICY.read_text())
    for name, change in patch["profiles"].items():
        document["profiles"][name].update(change)
    merged = tmp_path / "policy.yaml"
    merged.write_text(yaml.safe_dump(document))
    assert main(["policy", "check", str(merged)]) == 0
    policy = load_policy(merged)
    for name in ("calm", "hot"):
        ratio = float(policy.profiles[name].request_ratio)
        assert ratio == pytest.approx(wanted[name]["recommended"]["requestRatio"], abs=1e-3)


def test_no_change_is_an_empty_patch(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(tune(prometheus, "--policy", str(POLICY), "--min-pods", "100",
                     "-o", "yaml")) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"profiles": {}}


def test_saved_answers_are_what_the_decision_rests_on(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    saved = tmp_path / "answers.json"
    assert main(tune(prometheus, "--policy", str(POLICY), "--save-answers", str(saved))) == 0
    assert json.loads(saved.read_text())["figures"] == recorded("backfill.json")["figures"]


def test_answers_that_cannot_be_saved_fail_naming_the_file(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    saved = tmp_path / "no-such-dir" / "answers.json"
    assert main(tune(prometheus, "--policy", str(POLICY), "--save-answers", str(saved))) == 1
    assert f"--save-answers {saved}: No such file or directory" in capsys.readouterr().err


def test_a_missing_source_fails_naming_it(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str],
) -> None:
    window = recorded("backfill.json")["window"]
    prometheus.answers[probes(window)["kube_pod_annotations"]] = []
    assert main(tune(prometheus, "--policy", str(POLICY))) == 1
    err = capsys.readouterr().err
    assert "kube_pod_annotations:" in err and "metricAnnotationsAllowList" in err
    assert "container_memory_working_set_bytes" not in err


def test_prometheus_errors_are_reported_not_raised(
    prometheus: type[Recorded], capsys: pytest.CaptureFixture[str],
) -> None:
    prometheus.status = 422
    assert main(tune(prometheus)) == 1
    assert "answered 422: boom" in capsys.readouterr().err
    prometheus.status = 403
    assert main(tune(prometheus)) == 1
    assert "--bearer-token-file" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--prometheus", "http://127.0.0.1:1"], "cannot query Prometheus"),
    (["--prometheus", "prometheus:9090"], "not an http:// or https:// URL"),
    (["--prometheus", "http://127.0.0.1:1", "--window", "week"], "--window"),
    (["--prometheus", "http://127.0.0.1:1", "--min-pods", "0"], "at least 1"),
    (["--prometheus", "http://127.0.0.1:1", "--policy", "/nonexistent.yaml"],
     "/nonexistent.yaml"),
    (["--prometheus", "http://127.0.0.1:1", "--bearer-token-file", "/nonexistent"],
     "--bearer-token-file"),
])
def test_bad_input_is_a_clear_error(args: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("swapwise: ") and message in err, err


def test_something_that_is_not_prometheus_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    class Html(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "6")
            self.end_headers()
            self.wfile.write(b"<html>")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["tune", "--prometheus", f"http://127.0.0.1:{server.server_address[1]}"]) == 1
    finally:
        server.shutdown()
    assert "base URL" in capsys.readouterr().err


def test_the_real_nodes_hot_pods_without_a_cpu_limit_get_a_lower_ratio() -> None:
    """The real-node suite's hot scenario (docs/tune.md, "On a real swap node"): the same 19
    sandboxes without a CPU limit, touching their 110 MiB twice a second, wait for memory
    ~10-15 % of the time; tune lowers swapRatio to where the working set and the stall fit,
    and the suite then runs the pods that fit under the pressure guard's threshold."""
    policy = load_policy(DATA / "node-policy.yaml")
    found = by_profile(recommend(containers(recorded("node-hot-no-cpu-limit.json")["figures"]),
                                 policy, {}, min_samples=6))["tuned"]
    assert found.evidence.pods == 19
    assert found.evidence.stall_share_p95 is not None
    assert found.evidence.stall_share_p95 >= tuning.STALLING
    assert found.action == "lower"
    assert found.recommended_swap_ratio is not None and found.recommended_swap_ratio < 2
