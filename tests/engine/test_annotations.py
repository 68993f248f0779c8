"""docs/rules.md: swapwise.io/profile and swapwise.io/original, and JSON Pointer
escaping (engine/annotations.py)."""

from __future__ import annotations

import copy
import json

import jsonpatch
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from testkit.engine_check import apply
from testkit.engine_tables import DEFAULT, memory, profile
from testkit.pods import container, guaranteed, pod
from webhook.engine import mutate_pod
from webhook.engine.annotations import (
    ORIGINAL_ANNOTATION,
    RECORDED_LIMIT,
    RECORDED_PARTS,
    RECORDED_REQUEST,
    _compact_json,
    original_pod,
)


def test_annotations_created_when_pod_has_none() -> None:
    p = pod(guaranteed())
    assert "annotations" not in p["metadata"]
    mutation = mutate_pod(p, DEFAULT)
    ops = [op for op in mutation.patch if op["path"].startswith("/metadata")]
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {
        "swapwise.io/profile": "p",
        "swapwise.io/original": '{"app":{"request":"2Gi","limit":"2Gi"}}'}}]


def test_annotation_keys_are_escaped_in_json_pointers() -> None:
    p = pod(guaranteed(), annotations={"team.example/owner~x": "me"})
    mutation = mutate_pod(p, DEFAULT)
    paths = [op["path"] for op in mutation.patch if op["path"].startswith("/metadata")]
    assert paths == ["/metadata/annotations/swapwise.io~1profile",
                     "/metadata/annotations/swapwise.io~1original"]
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["team.example/owner~x"] == "me"


def test_pod_without_metadata() -> None:
    p = {"spec": {"containers": [guaranteed()]}}
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "p"


def test_original_annotation_keeps_earlier_entries() -> None:
    earlier = '{"app":{"request":"4Gi","limit":"4Gi"}}'
    p = pod(guaranteed("1Gi"), guaranteed("1Gi", name="b"),
            annotations={"swapwise.io/original": earlier, "swapwise.io/profile": "p"})
    result, _ = apply(p, DEFAULT)
    assert json.loads(result["metadata"]["annotations"]["swapwise.io/original"]) == {
        "app": {"request": "4Gi", "limit": "4Gi"}, "b": {"request": "1Gi", "limit": "1Gi"}}


def test_profile_annotation_replaced_when_different() -> None:
    p = pod(guaranteed(), annotations={"swapwise.io/profile": "other"})
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "p"


def test_long_container_names_keep_warnings_short() -> None:
    name = "x" * 63
    _, mutation = apply(pod(guaranteed("1610612736", name=name)), DEFAULT)
    assert len(mutation.warnings[0]) == 120 and mutation.warnings[0].endswith("...")


@given(st.dictionaries(st.text(), st.dictionaries(st.sampled_from(["request", "limit"]),
                                                   st.text())))
@example({chr(c): {"request": chr(c)} for c in range(128)})  # every ASCII one, DEL included
@settings(deadline=None)  # no timing here: make test runs this beside the Go builds
def test_the_original_annotation_text_is_the_stdlib_compact_json(value: dict) -> None:
    """orjson writes it on the hot path; the text must be what json.dumps writes."""
    assert _compact_json(value) == json.dumps(value, separators=(",", ":"))


def _read_as_the_cel_does(text: str, name: str) -> list[str]:
    """cel_recorded's string operations, step for step, in Python."""
    key = json.dumps(name) + ":"  # strings.quote(name) + ':'
    entry = text[text.index(key) + len(key):]
    return entry[:entry.index("}") + 1].split('"')


def test_the_rendered_policies_read_the_annotation_the_engine_writes() -> None:
    """The CEL form of swapwise.io/original (cel_recorded and RECORDED_*) finds each
    container's recorded request and limit in the text the Python encoder writes; an entry
    of {} (defaultLimit) has too few parts. The e2e equivalence test runs the CEL itself."""
    recorded = {"app": {"request": "2Gi", "limit": "2Gi"}, "side-car.1": {},
                "web": {"request": "1500M", "limit": "3Gi"}}
    text = _compact_json(recorded)
    for name, entry in recorded.items():
        parts = _read_as_the_cel_does(text, name)
        if not entry:
            assert len(parts) < RECORDED_PARTS
            continue
        assert len(parts) >= RECORDED_PARTS
        assert parts[RECORDED_REQUEST] == entry["request"]
        assert parts[RECORDED_LIMIT] == entry["limit"]
    written = mutate_pod(pod(guaranteed("3Gi")), DEFAULT).patch[-1]["value"][ORIGINAL_ANNOTATION]
    assert _read_as_the_cel_does(written, "app")[RECORDED_LIMIT] == "3Gi"


def test_original_pod_reads_the_annotation_backwards() -> None:
    """original_pod: the reshaped pod with each changed container's memory as it came, a
    limit that defaultLimit added taken away, and everything else as it is."""
    before = pod(guaranteed(), container("bare", cpu="100m"), container("set", request="1Gi",
                                                                      limit="2Gi"))
    given_limit = profile(defaultLimit="1Gi")
    after = jsonpatch.apply_patch(before, mutate_pod(before, given_limit).patch)
    assert memory(after) == {"request": "683Mi", "limit": "2Gi"}
    assert memory(after, 1) == {"request": "342Mi", "limit": "1Gi"}
    kept = copy.deepcopy(after)
    restored = original_pod(after)
    assert after == kept  # a copy: the pod given is not changed
    assert restored is not None
    assert [memory(restored, i) for i in range(3)] == [
        {"request": "2Gi", "limit": "2Gi"}, {"request": None, "limit": None},
        {"request": "1Gi", "limit": "2Gi"}]
    assert restored["metadata"] == after["metadata"]
    assert restored["spec"]["affinity"] == after["spec"]["affinity"]


@pytest.mark.parametrize("annotation", [
    None, "{}", "not json", '{"app": {"request": 5}}', '{"app": "2Gi"}', 7])
def test_original_pod_without_a_readable_record_is_none(annotation: object) -> None:
    p = pod(container(request="683Mi", limit="2Gi"))
    if annotation is not None:
        p["metadata"]["annotations"] = {ORIGINAL_ANNOTATION: annotation}
    assert original_pod(p) is None
    assert original_pod({"spec": {"containers": "not a list"},
                         "metadata": {"annotations": {ORIGINAL_ANNOTATION: "{}"}}}) is None
