"""benchmarks/serve_export.py end to end at tiny width on the CPU: it writes an export in the real
layout, starts `wamkit serve EXPORT` as its own process, measures with openpi's client (plain and
real-time chunking, 1 and 2 clients), sends every bad request, soaks for one short row, runs the
in-process harness row, and prints the tables and `serve_p50_ms=`. Numbers are not asserted."""

import json
import os
import subprocess
import sys

from tests.helpers import REPO

ARGS = ["--preset", "tiny", "--device", "cpu", "--image-size", "32", "--text-tokens", "16", "--clients", "1,2",
        "--requests", "2", "--warmup-requests", "1", "--kind", "cpu-test"]


def _run(*args):
    # One intra-op thread, in the server process too: on the shared 2-core machine two threads made every
    # chunk 10-30x slower (threads waiting on each other's descheduled cores), and this test 3x longer.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "benchmarks/serve_export.py", *ARGS, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env=env)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_serve_export_measures_the_export_in_its_own_process(tmp_path):
    export = tmp_path / "export"
    proc = _run("--export", str(export), "--log-dir", str(tmp_path), "--parts", "inprocess,latency,bad",
                "--soak-minutes", "1", "--soak-minute-s", "3")
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]

    # the export: the files `wamkit export` writes, the G1 data contract, bf16 weights served as bf16
    assert (export / "transformer" / "config.json").is_file() and list((export / "transformer").glob("*.safetensors"))
    manifest = json.loads((export / "wamkit.json").read_text())
    contract = manifest["data_contract"]
    assert (contract["chunk_length"], contract["action_dim"], contract["state_dim"], contract["camera_sizes"]) == (32, 36, 32, [[32, 32]])
    assert manifest["format"] == "wamkit-export" and manifest["model"]["preset"] == "tiny" and manifest["experiment_config"]
    assert "weights bfloat16" in out and "/healthz 200 after" in out
    assert "host CPU:" in out and "kind cpu-test" in out

    # the latency table: both paths, every level, plain and RTC; first request after /healthz
    header = next(line for line in out.splitlines() if line.startswith("| path |"))
    assert _cells(header)[:7] == ["path", "clients", "request", "requests", "first ms", "p50 ms/chunk", "p99 ms/chunk"]
    rows = [_cells(line) for line in out.splitlines() if line.startswith("| `wamkit serve EXPORT`") or line.startswith("| in-process")]
    kinds = {(r[0].split(" (")[0], r[1], r[2].split(" ")[0]) for r in rows}
    assert kinds == {("`wamkit serve EXPORT`", c, f) for c in "12" for f in ("plain", "RTC")} | {("in-process harness", c, "plain") for c in "12"}
    assert all(r[10] == "0" and float(r[5]) > 0 for r in rows)  # no errors, a p50
    first = next(r for r in rows if r[0].startswith("`wamkit") and r[1] == "1" and r[2] == "plain")
    assert float(first[4]) > 0 and "first request after /healthz 200:" in out

    # bad requests: every one a named error, and the server kept serving
    bad = [_cells(line) for line in out.splitlines() if line.startswith("| ") and line.rstrip().endswith("|")
           and len(_cells(line)) == 4 and _cells(line)[2] in ("yes", "NO")]
    assert len(bad) == 13 and all(r[2:] == ["yes", "yes"] for r in bad), bad
    replies = " ".join(r[1] for r in bad)
    for named in ("request['state']: shape is (31,)", "contains NaN/inf", "--max-request-bytes", "is not valid msgpack",
                  "is a text message", "close 1009", "request['committed_actions']"):
        assert named in replies
    assert "the server counted 12 errors for 12 text-error replies" in out

    # the soak row: no errors, the server's RSS from /proc (on a loaded CPU no request may finish in 3 s)
    soak = next(_cells(line) for line in out.splitlines() if line.startswith("| 1 | 3.0 |"))
    assert int(soak[2]) >= 0 and soak[3] == "0" and float(soak[9]) > 0
    assert (tmp_path / "wamkit_serve.log").is_file() and (tmp_path / "serve_export_results.json").is_file()
    assert out.strip().splitlines()[-1].startswith("serve_p50_ms=") and float(out.strip().splitlines()[-1].split("=")[1]) > 0

    # a second call reuses the export instead of writing it again
    again = _run("--export", str(export), "--log-dir", str(tmp_path), "--parts", "")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"export reused {export}" in again.stdout


def test_serve_export_with_fp8_serves_through_fp8_matmuls(tmp_path):
    """--fp8 starts `wamkit serve --fp8`: the served process reports its quantized layers (tiny: 2 layers x
    7 generation-pathway projections), the chunks come back, and the RESULTS line says fp8."""
    proc = _run("--export", str(tmp_path / "export"), "--log-dir", str(tmp_path), "--parts", "latency,inprocess", "--clients", "1",
                "--fp8")
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "with FP8 matmuls in 14 generation-pathway linear layers" in out and "FP8 matmuls in the generation pathway" in out
    assert any(line.startswith("serve_p50_ms_fp8=") for line in out.splitlines())
    diff = next(line for line in out.splitlines() if "against bf16, one chunk" in line)
    assert 0 < float(diff.split("relative difference ")[1].split()[0]) < 0.2  # FP8 ran, and close
