"""Where an admission's CPU goes behind kube-apiserver: the server cut down, step by step.

    python -m benchmarks.decompose OUT_DIR [--rev HEAD]
    python -m benchmarks.apiserver --creators 16 --rounds 3 \\
        --compare OUT_DIR/metrics --compare OUT_DIR/decide \\
        --compare OUT_DIR/parse --compare OUT_DIR/stack

Writes four copies of the ``webhook`` package of ``--rev`` (``git archive``), each doing
less per admission than the one before; ``benchmarks.apiserver --compare`` runs them beside
the full server and the floor, behind the same API server, through the same seconds:

- ``metrics``: everything but the admission's log line;
- ``decide``: parse, decide, serialize (``evaluate``); no metrics, no log line;
- ``parse``: the review parsed and checked (``parse_review``), nothing decided: the
  answer is the one the full server gives the benchmark's pod (computed once, by the full
  decision, on the first admission), with this review's uid;
- ``stack``: no JSON at all: the uid found with the floor's regex, the same answer.

Every copy answers with the same bytes as the full server (so writing the answer costs
each the same), through the same HTTP path (the connection protocol's admission fast
path), so the differences between neighbours are what parsing, deciding, counting and
logging cost where the API server calls. The last two copies answer every pod as the
benchmark's pod: they are measuring instruments, never servers.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from benchmarks.floor import UID

REPO = Path(__file__).resolve().parents[1]
APP = Path("webhook/server/app.py")

RESPOND = '''        started = time.perf_counter()
        policy, label = self.policy_for(profile)
        return self.record(profile, label, evaluate(body, profile, policy), started)'''

LOG_LINE = '''        asynclog.info(
            log,'''

# The stub copies: the full answer of the first admission, split around its uid.
FIRST_ANSWER = '''        if not hasattr(self, "_answer"):
            policy, label = self.policy_for(profile)
            first = evaluate(body, profile, policy)
            assert first.uid is not None and first.content.count(first.uid.encode()) == 1
            self._answer = first.content.partition(first.uid.encode())[::2]
        head, tail = self._answer
'''

CUTS: dict[str, tuple[str, str]] = {
    "metrics": (LOG_LINE, '''        if False:  # decompose: no log line
          asynclog.info(
            log,'''),
    "decide": (RESPOND, '''        policy, label = self.policy_for(profile)
        answer = evaluate(body, profile, policy)
        return answer.status, answer.content'''),
    "parse": (RESPOND, FIRST_ANSWER + '''        uid = parse_review(parse_body(body))["uid"]
        return 200, head + uid.encode() + tail'''),
    "stack": (RESPOND, FIRST_ANSWER + f'''        import re
        found = re.search({UID.pattern!r}, body)  # benchmarks/floor.py's UID
        return 200, head + (found.group(1) if found else b"") + tail'''),
}


def extract(rev: str, out: Path) -> None:
    archive = subprocess.run(["git", "archive", rev, "webhook"], check=True,
                             capture_output=True, cwd=REPO).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")


def cut(text: str, name: str) -> str:
    """``text`` (app.py) with the ``name`` copy's cut; refused if app.py has changed."""
    old, new = CUTS[name]
    if text.count(old) != 1:
        raise SystemExit(f"{APP} no longer has the code the {name!r} copy cuts; "
                         "update benchmarks/decompose.py")
    return text.replace(old, new)


def write_trees(out: Path, rev: str = "HEAD") -> dict[str, Path]:
    """The four copies under ``out`` (replaced if there), by name."""
    trees = {}
    for name in CUTS:
        tree = out / name
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        extract(rev, tree)
        app = tree / APP
        app.write_text(cut(app.read_text(), name))
        trees[name] = tree
    return trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rev", default="HEAD", help="the revision to cut down")
    args = parser.parse_args()
    trees = write_trees(args.out.resolve(), args.rev)
    compare = " ".join(f"--compare {tree}" for tree in trees.values())
    print(f"python -m benchmarks.apiserver --creators 16 --rounds 3 {compare}")


if __name__ == "__main__":
    main()
