"""`wamkit data doctor` beside lerobot-doctor 0.2.0 on the broken-dataset corpus of tests/data/doctor_corpus.py.

    python3 -m venv /tmp/lrdoc && /tmp/lrdoc/bin/pip install lerobot-doctor==0.2.0
    python benchmarks/doctor_coverage.py [--lerobot-doctor /tmp/lrdoc/bin/lerobot-doctor]

Each case is built from the same clean base dataset, then both tools run on it. lerobot-doctor warns
about the clean base already (it has heuristics like "76.8% of values at maximum"), so its column shows
only what is new against the base (messages compared with their numbers masked): FAIL, WARN or nothing,
with its first new message. wamkit's column is its verdict with the case's recipe expectation: ERROR
and/or WARNING codes, or nothing. The last lines count the cases lerobot-doctor catches that wamkit
does not, and the cases that break training without a wamkit error (both should be 0).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.data.doctor_corpus import CASES, build_case, write_base  # noqa: E402
from wamkit.data.doctor import diagnose  # noqa: E402


def lerobot_doctor(exe: str, root: Path) -> tuple[str, list[tuple[str, str]]]:
    """('ok' | 'crashed' | 'refused', [(severity, message)]) of `lerobot-doctor check ROOT --json`."""
    proc = subprocess.run([exe, "check", str(root), "--json"], capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        status = "crashed" if "Traceback" in proc.stderr else "refused"
        return status, [("FAIL", last[:120])]
    return "ok", [(m["severity"], m["message"]) for c in report["checks"] for m in c["messages"]
                  if m["severity"] != "PASS"]


def masked(message: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", message)


def lerobot_column(status: str, messages: list[tuple[str, str]], base: set[str]) -> tuple[str, str]:
    """(verdict, first new message) against the clean base's messages."""
    new = [(s, m) for s, m in messages if masked(m) not in base]
    if status != "ok":
        return ("FAIL (crashed)" if status == "crashed" else "FAIL (refused to load)"), new[0][1]
    for severity in ("FAIL", "WARN"):
        hits = [m for s, m in new if s == severity]
        if hits:
            return severity, hits[0]
    return "nothing", ""


def wamkit_column(report) -> str:
    parts = []
    if report.errors:
        parts.append("ERROR " + ", ".join(sorted(report.codes("error"))))
    if report.warnings:
        parts.append("WARNING " + ", ".join(sorted(report.codes("warning"))))
    return "; ".join(parts) or "nothing"


def cell(text: str, width: int = 110) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lerobot-doctor", default="/tmp/lrdoc/bin/lerobot-doctor")
    p.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    args = p.parse_args(argv)
    cases = [c for c in CASES if args.cases is None or c.name in args.cases]
    rows, missed, unguarded = [], [], []
    with tempfile.TemporaryDirectory(prefix="wamkit-doctor-") as tmp:
        base = write_base(Path(tmp) / "base")
        base_status, base_messages = lerobot_doctor(args.lerobot_doctor, base)
        assert base_status == "ok", base_messages
        seen = {masked(m) for _, m in base_messages}
        base_ours = wamkit_column(diagnose(base, CASES[0].expect))
        for i, case in enumerate(cases):
            root = build_case(case, base, Path(tmp) / f"case{i}")
            theirs, first = lerobot_column(*lerobot_doctor(args.lerobot_doctor, root), seen)
            report = diagnose(root, case.expect)
            ours = wamkit_column(report)
            if theirs != "nothing" and ours == "nothing":
                missed.append(case.name)
            if case.breaks_training and report.ok:
                unguarded.append(case.name)
            rows.append((case.name, case.what, theirs, first, ours))
            print(f"{case.name}: lerobot-doctor {theirs}; wamkit {ours}", file=sys.stderr, flush=True)
    print(f"clean base: lerobot-doctor {base_status}, {len(base_messages)} WARN/FAIL message(s) of its own "
          f"(masked out below); wamkit {base_ours}\n")
    print("| case | what | lerobot-doctor 0.2.0 (new vs. the clean base) | wamkit data doctor |")
    print("| --- | --- | --- | --- |")
    for name, what, theirs, first, ours in rows:
        print(f"| {name} | {cell(what, 80)} | {theirs}{': ' + cell(first) if first else ''} | {ours} |")
    print(f"\n{len(rows)} cases; lerobot-doctor reports {sum(r[2] != 'nothing' for r in rows)}, wamkit "
          f"{sum(r[4] != 'nothing' for r in rows)}; caught by lerobot-doctor but not wamkit: {missed or 'none'}; "
          f"breaking training without a wamkit error: {unguarded or 'none'}")


if __name__ == "__main__":
    main()
