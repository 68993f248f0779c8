"""benchmarks/decompose.py: each cut-down copy answers the benchmark's pod with the full
server's bytes, and does only what its name says (so the differences it measures are
what parsing, deciding, counting and logging cost)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.decompose import APP, CUTS, cut, extract, write_trees

ROOT = Path(__file__).resolve().parents[2]

# Run with the copy's package first on the path: two admissions of the benchmark's pod
# with different uids, what each answered, whether it counted and whether it logged.
PROBE = textwrap.dedent(
    """
    import json, logging, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    import webhook
    from benchmarks.common import build_app
    from testkit import payloads

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("swapwise.admission").addHandler(handler)
    logging.getLogger("swapwise.admission").setLevel("INFO")
    admission = build_app().endpoint
    answers = []
    for uid in ("11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"):
        body = payloads.dumps(payloads.review(payloads.pod(4), uid))
        status, content = admission.respond("sandbox", body)
        answers.append([status, content.decode()])
    counted = sum(s.value for m in admission.metrics.requests.collect() for s in m.samples
                  if s.name.endswith("_total"))
    print(json.dumps({"package": webhook.__file__, "answers": answers, "counted": counted,
                      "logged": lines}))
    """
)


def probe(tree: Path) -> dict[str, object]:
    package = str(tree)
    proc = subprocess.run([sys.executable, "-c", PROBE, package, str(ROOT)], check=True,
                          capture_output=True, text=True, timeout=120)
    result: dict[str, object] = json.loads(proc.stdout)
    assert str(result["package"]).startswith(package)
    return result


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """The uncut package of HEAD, and the copies cut from it."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")  # the copies are cut from a revision
    out = tmp_path_factory.mktemp("decompose")
    extract("HEAD", out / "full")  # the revision the copies are cut from, uncut
    return out / "full", write_trees(out)


def test_every_copy_answers_with_the_full_servers_bytes(
        trees: tuple[Path, dict[str, Path]]) -> None:
    uncut, copies = trees
    full = probe(uncut)
    answers = full["answers"]
    assert isinstance(answers, list)
    assert [status for status, _ in answers] == [200, 200]
    assert '"patch"' in answers[0][1]  # the benchmark's pod is reshaped
    assert "11111111" in answers[0][1] and "22222222" in answers[1][1]
    assert full["counted"] == 2 and full["logged"] == ["admission", "admission"]
    assert list(copies) == list(CUTS)
    expected = {  # what each copy still counts and logs
        "metrics": (2, []), "decide": (0, []), "parse": (0, []), "stack": (0, []),
    }
    for name, tree in copies.items():
        cut = probe(tree)
        assert cut["answers"] == answers, name
        assert (cut["counted"], cut["logged"]) == expected[name], name


def test_an_app_without_the_cut_code_is_refused() -> None:
    text = (ROOT / APP).read_text()
    for name, (old, _new) in CUTS.items():
        assert cut(text, name) != text
        with pytest.raises(SystemExit, match="no longer has the code"):
            cut(text.replace(old, ""), name)
