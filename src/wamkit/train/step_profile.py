"""Where a training step's time goes: a diagnostic (WAMKIT_PROFILE_STEPS=N profiles N warm steps).

At small widths a step is bound by the host, not by arithmetic: the bimanual chain's medium world
model spends 89 ms in forward + backward for ~2 ms of FLOPs on an H200 (benchmarks/RESULTS.md).
torch.profiler over a few warm steps says how much of the wall time the GPU is busy, how many ops
and kernel launches a step issues, and which wamkit or diffusers function issues them, which is
what any vectorisation or graph capture of the step has to target. The chrome trace is written
beside metrics.jsonl for a closer look (chrome://tracing or ui.perfetto.dev)."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ENV = "WAMKIT_PROFILE_STEPS"
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync")
# A Python frame event of the profiler's tracer: "<path>/wamkit/x/y.py(123): function"
_FRAME = re.compile(r"((?:wamkit|diffusers)/[\w/]+\.py)\(\d+\): ([\w<>]+)")
# torch's own frames ("<path>/torch/distributed/fsdp/_fully_shard/_fsdp_state.py(80): _pre_forward") and the autograd
# engine's node spans: where the ops outside every wamkit or diffusers frame come from (FSDP2's hooks, the backward)
_TORCH_FRAME = re.compile(r"(torch/[\w/]+\.py)\(\d+\): ([\w<>]+)")
_BACKWARD_NODE = "autograd::engine::evaluate_function: "


def requested_steps() -> int:
    value = os.environ.get(ENV, "").strip()
    try:
        return max(0, int(value or 0))
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: set it to the number of warm steps to profile (e.g. 3)") from None


class StepProfile:
    """Profiles `steps` consecutive training steps from the first one `begin` is called for, then
    prints its summary once (`end` after every step). Inactive with steps = 0."""

    def __init__(self, steps: int, device: torch.device, out_dir: Path, print_fn=print):
        self.left, self.device, self.out_dir, self.print = int(steps), device, Path(out_dir), print_fn
        self._prof = None
        self.first_step = 0

    def begin(self, step: int) -> None:
        if self.left <= 0 or self._prof is not None:
            return
        self._prof, self._t0 = _start(self.device)
        self.first_step = step

    def end(self, step: int, last: bool = False) -> None:
        """After each step; `last`: the run's final step, which ends a profile short of its N steps."""
        if self._prof is None:
            return
        self.left = 0 if last else self.left - 1
        if self.left > 0:
            return
        prof, self._prof = self._prof, None
        wall = _stop(prof, self.device, self._t0)
        steps = step - self.first_step + 1
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for line in summary_lines(prof.events(), steps, wall, f"steps {self.first_step}-{step}"):
            self.print(f"[wamkit] {line}", flush=True)
        # The trace after the summary: writing every event with its stack takes tens of seconds for an
        # MT10-sized step on the GPU host, and a time-boxed run cut meanwhile keeps the summary.
        trace = self.out_dir / f"profile_steps_{self.first_step}-{step}.json"
        prof.export_chrome_trace(str(trace))
        self.print(f"[wamkit] trace: {trace}", flush=True)
        if not has_frames(prof.events()):  # Python 3.12: the frames are in the trace alone
            for line in trace_lines(trace, steps):
                self.print(f"[wamkit] {line}", flush=True)


def _start(device: torch.device) -> tuple[profile, float]:
    """torch.profiler recording host ops with their Python stacks (and the GPU's kernels on CUDA), entered."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, with_stack=True)
    prof.__enter__()
    return prof, time.perf_counter()


def _stop(prof: profile, device: torch.device, t0: float) -> float:
    """End the recording once the GPU has run what was queued; the wall seconds since `t0`."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    prof.__exit__(None, None, None)
    return wall


def site_of(event) -> str:
    """The innermost wamkit or diffusers function an event ran under ("(other)": torch's own, e.g. autograd)."""
    e = event.cpu_parent
    while e is not None:
        m = _FRAME.search(e.name)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
        e = e.cpu_parent
    return "(other)"


def trace_by_function(events: list[dict]) -> dict[str, list]:
    """Top-level ops, kernel launches and the ops' host ms by the innermost wamkit or diffusers Python frame
    around them, from a chrome trace's events (`traceEvents`), found by time on each thread. On the GPU
    host's Python 3.12 the profiler's events carry no Python frames (prof.events() has none; only the
    exported trace does), so the summary's attribution reads "(other)" there and this one does not.
    Ops outside every such frame are named by the autograd node being evaluated ("(backward) MmBackward0": the
    backward, on the autograd thread), else by the innermost torch frame (FSDP2's hooks, the optimizer); else
    they are "(other)"."""
    by_thread = defaultdict(list)
    for e in events:
        entry = _trace_entry(e)
        if entry is not None:
            by_thread[(e.get("pid"), e.get("tid"))].append(entry)
    by_site = defaultdict(lambda: [0, 0, 0.0])  # ops, launches, host ms of the ops
    for timeline in by_thread.values():
        timeline.sort()
        frames: dict[int, list[tuple[float, str]]] = {OURS: [], BACKWARD: [], TORCH: []}  # open (end, site), innermost last
        op_end = float("-inf")  # the end of the open top-level op: anything starting before it is nested
        for start, kind, neg_dur, site in timeline:
            for stack in frames.values():
                while stack and stack[-1][0] <= start:
                    stack.pop()
            here = by_site[next((stack[-1][1] for stack in frames.values() if stack), "(other)")]
            if kind in frames:
                frames[kind].append((start - neg_dur, site))
            elif kind == OP and start >= op_end:
                op_end = start - neg_dur
                here[0] += 1
                here[2] += -neg_dur / 1e3
            elif kind == LAUNCH:
                here[1] += 1
    return by_site


# What a trace event is to trace_by_function, in the order a site is chosen: the innermost wamkit or diffusers
# frame, else the autograd node being evaluated, else the innermost torch frame
OURS, BACKWARD, TORCH, OP, LAUNCH = range(5)


def _trace_entry(e: dict) -> tuple[float, int, float, str] | None:
    """(start, kind, -duration, site) of a span that trace_by_function reads, or None."""
    cat, name = e.get("cat"), e.get("name", "")
    if e.get("ph") != "X":
        return None
    if cat == "python_function":
        frame, torch_frame = _FRAME.search(name), _TORCH_FRAME.search(name)
        if frame:
            kind, site = OURS, f"{frame.group(1)}:{frame.group(2)}"
        elif torch_frame:
            kind, site = TORCH, f"{torch_frame.group(1)}:{torch_frame.group(2)}"
        else:
            return None
    elif cat == "cpu_op" and name.startswith(_BACKWARD_NODE):
        kind, site = BACKWARD, "(backward) " + name[len(_BACKWARD_NODE):]
    elif cat == "cpu_op" and name.startswith("aten::"):
        kind, site = OP, ""
    elif cat == "cuda_runtime" and name in LAUNCHES:
        kind, site = LAUNCH, ""
    else:
        return None  # annotations and other runtime calls (the aten ops inside them count)
    return float(e["ts"]), kind, -float(e.get("dur", 0.0)), site


def has_frames(events) -> bool:
    """Whether the profiler's events hold Python frames to attribute ops to (not on the GPU host's Python 3.12)."""
    return any(_FRAME.search(e.name) for e in events)


TRACE_ROWS = 24  # the trace's table names backward nodes and torch's frames too: more rows than the summary's


def trace_lines(trace: Path, units: int, unit: str = "step") -> list[str]:
    """The by-function table of an exported chrome trace (`trace_by_function`), headed."""
    by_site = trace_by_function(json.loads(Path(trace).read_text())["traceEvents"])
    return [f"by function, from the trace (ops / launches / host ms in those ops, a {unit}):",
            *by_function_lines(by_site, units, unit, rows=TRACE_ROWS)]


def by_function_lines(by_site: dict, steps: int, unit: str = "step", rows: int = 12) -> list[str]:
    """The `rows` sites with the most host ms, a line each: ops / launches / host ms, per `unit`."""
    per = lambda x: x / max(steps, 1)  # noqa: E731
    return [f"  {site:64s} {per(n):7.0f} / {per(k):6.0f} / {per(ms):7.2f}"
            for site, (n, k, ms) in sorted(by_site.items(), key=lambda kv: -kv[1][2])[:rows]]


def _top_level_op(e) -> bool:
    return e.name.startswith("aten::") and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))


def gpu_kernels(events) -> list:
    """The events that ran on the GPU, less the annotations' GPU-side spans (`record_function` ranges such as
    "Optimizer.step#AdamW.step" or FSDP2's "FSDP::pre_forward"): those cover their kernels and the idle gaps
    between them, so counting them as busy time double-counts the kernels and calls a host-bound step busy."""
    return [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def summary_lines(events, steps: int, wall_s: float, label: str, rows: int = 12, unit: str = "step") -> list[str]:
    """The summary of profiled `events` over `steps` units (training steps, or a rollout's batched
    predicts) that took `wall_s` seconds in all."""
    per = lambda x: x / max(steps, 1)  # noqa: E731
    kernels = gpu_kernels(events)
    busy_ms = per(sum(k.time_range.elapsed_us() for k in kernels) / 1e3)
    step_ms = per(wall_s * 1e3)
    by_site = defaultdict(lambda: [0, 0, 0.0])  # ops, launches, host ms of the ops
    for e in events:
        if _top_level_op(e):
            site = by_site[site_of(e)]
            site[0] += 1
            site[2] += e.cpu_time_total / 1e3
        elif e.name in LAUNCHES:
            by_site[site_of(e)][1] += 1
    ops, launches = (sum(v[i] for v in by_site.values()) for i in (0, 1))
    bound = ("GPU-bound" if busy_ms > 0.8 * step_ms else "host-bound") if kernels else "no GPU kernels (CPU run)"
    lines = [f"profile of {label} ({steps} {unit}s): {step_ms:.1f} ms a {unit}, GPU kernels busy {busy_ms:.1f} ms "
             f"({busy_ms / step_ms:.0%}): {bound}"]
    counts = f"per {unit}: {per(ops):,.0f} top-level ops, {per(launches):,.0f} kernel launches and copies"
    if has_frames(events):
        lines += [f"{counts}; by function (ops / launches / host ms in those ops, a {unit}):",
                  *by_function_lines(by_site, steps, unit, rows)]
    else:  # Python 3.12: every op would read "(other)"; the table comes from the exported trace
        lines.append(f"{counts} (by function: from the trace, below)")
    if kernels:
        gpu = defaultdict(float)
        for k in kernels:
            gpu[k.name] += k.time_range.elapsed_us() / 1e3
        top = sorted(gpu.items(), key=lambda kv: -kv[1])[:6]
        lines.append(f"top GPU kernels (ms a {unit}): " + "; ".join(f"{name[:60]} {per(ms):.2f}" for name, ms in top))
    return lines


ROLLOUTS_ENV = "WAMKIT_PROFILE_ROLLOUTS"


class RolloutProfile:
    """WAMKIT_PROFILE_ROLLOUTS=1: the same summary over a world model's timed rollouts, per batched
    predict (a diagnostic: the profiler's own host cost slows that run, so its real-time factor is not
    the product's number). `start` returns None when the variable is unset."""

    def __init__(self, device: torch.device):
        self.device = device
        self._prof, self._t0 = _start(device)

    @classmethod
    def start(cls, device: torch.device) -> "RolloutProfile | None":
        return cls(device) if os.environ.get(ROLLOUTS_ENV, "").strip() not in ("", "0") else None

    def finish(self, batches: int, label: str, print_fn=print) -> None:
        wall = _stop(self._prof, self.device, self._t0)
        events = self._prof.events()
        lines = summary_lines(events, batches, wall, label, unit="predict")
        if not has_frames(events):  # Python 3.12: only an exported trace holds the frames
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "rollouts.json"
                self._prof.export_chrome_trace(str(trace))
                lines += trace_lines(trace, batches, "predict")
        for line in lines:
            print_fn(f"[wamkit] {line}", flush=True)
