"""CUDA-graph replay for inference.

At serving batch sizes a denoising forward is a few hundred tokens through 36 layers, and the VAE
encodes a single frame: thousands of small kernels whose launch cost exceeds their run time. Each
such function is captured once per distinct input shape and replayed. A captured graph reads fixed
addresses, so everything it reads must stay put between replays: inputs are copied into static
buffers, and whatever else it reads (attention masks, recorded text K/V) is kept alive with it."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


class GraphCache:
    """Graphs by key; least recently used ones beyond `max_graphs` are freed."""

    def __init__(self, max_graphs: int = 16, warmup_runs: int = 2):
        self.max_graphs, self.warmup_runs = max_graphs, warmup_runs
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()
        self.captures = 0

    def clear(self) -> None:
        self._graphs.clear()

    def run(self, key: tuple, fn: Callable[[list[torch.Tensor]], object], inputs: list[torch.Tensor], keepalive: object = None):
        """fn(inputs) through the graph captured for `key` (capturing it on first use). `fn` must
        read only `inputs` and state that `keepalive` holds; its output tensors are overwritten by
        the next replay of the same key."""
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(fn, inputs, keepalive)
            self._graphs[key] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        graph, static_in, static_out, _ = entry
        for dst, src in zip(static_in, inputs):
            dst.copy_(src)
        graph.replay()
        return static_out

    def _capture(self, fn, inputs, keepalive):
        static_in = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: compiles kernels, allocates lasting buffers
            for _ in range(self.warmup_runs):
                fn(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn(static_in)
        self.captures += 1
        return graph, static_in, static_out, keepalive


class _ReplayedMethod:
    """Replaces the method `name` of one CUDA model with graph replay (`__call__` of the subclass);
    `remove()` puts the model's own method back."""

    name = ""

    def __init__(self, model, processor, max_graphs: int = 16):
        if not next(model.parameters()).is_cuda:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.processor = model, processor
        self.cache = GraphCache(max_graphs)
        self._plain = getattr(model, self.name)
        setattr(model, self.name, self)

    @property
    def captures(self) -> int:
        return self.cache.captures

    def remove(self) -> None:
        """Back to the model's own method (frees every graph)."""
        setattr(self.model, self.name, self._plain)
        self.cache.clear()


class DecoderStackGraphs(_ReplayedMethod):
    """Replaces `model._run_decoder_stack` on one CUDA model (most of a forward's arithmetic). Keyed
    by the processor's graph_key (its masks), the text-cache mode and the input shapes; training (grad enabled) and
    unkeyed layouts run plainly."""

    name = "_run_decoder_stack"

    def __init__(self, model, processor, max_graphs: int = 16):
        super().__init__(model, processor, max_graphs)
        self.bypass = False  # set while a whole-forward graph (ForwardGraphs) warms up or captures: part of that one

    def __call__(self, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb: tuple):
        layout = getattr(self.processor, "graph_key", None)
        if torch.is_grad_enabled() or layout is None or self.bypass:
            return self._plain(und_seq, gen_seq, rotary_emb)
        key = (layout, getattr(self.processor, "text_cache", "off"), tuple(und_seq.shape), tuple(gen_seq.shape), und_seq.dtype)
        return self.cache.run(key, self._run, [und_seq, gen_seq, *rotary_emb], keepalive=self.processor.captured_state())

    def _run(self, inputs: list[torch.Tensor]):
        rewind = getattr(self.processor, "rewind_text_cache", None)
        if rewind is not None:
            rewind()
        return self._plain(inputs[0], inputs[1], tuple(inputs[2:]))


class ForwardGraphs(_ReplayedMethod):
    """Replaces `model.forward` on one CUDA model with whole-forward replay: the embeddings, the
    patchify and timestep code, the decoder stack and the heads of one denoising step as one graph.
    What DecoderStackGraphs leaves outside its graph is diffusers' per-sample Python: hundreds of
    small kernels a step at policy batch sizes. Keyed like DecoderStackGraphs plus every
    non-tensor argument (sequence length, token shapes). Training (grad enabled), inputs off the
    GPU and unkeyed layouts run plainly; a capture that fails is said once, with its cause, and
    every later call runs plainly (the decoder stack still replays its own graphs). Capturable
    because wamkit's models carry action heads without a device-side check
    (wamkit.model.cosmos3.HostCheckedDomainLinear)."""

    name = "forward"

    def __init__(self, model, processor, max_graphs: int = 16):
        super().__init__(model, processor, max_graphs)
        self.failure: str | None = None

    def __call__(self, **kwargs):
        layout = getattr(self.processor, "graph_key", None)
        if torch.is_grad_enabled() or layout is None or self.failure is not None:
            return self._plain(**kwargs)
        tensors, structure = flatten_arguments(kwargs)
        if not all(t.is_cuda for t in tensors):
            return self._plain(**kwargs)
        key = (layout, getattr(self.processor, "text_cache", "off"), structure,
               tuple((tuple(t.shape), t.dtype) for t in tensors))

        def run(inputs: list[torch.Tensor]):
            rewind = getattr(self.processor, "rewind_text_cache", None)
            if rewind is not None:
                rewind()
            return self._plain(**unflatten_arguments(inputs, structure))

        stack = self.model._run_decoder_stack
        if isinstance(stack, DecoderStackGraphs):
            stack.bypass = True
        try:
            return self._replay(key, run, tensors)
        finally:
            if isinstance(stack, DecoderStackGraphs):
                stack.bypass = False

    def _replay(self, key, run, tensors: list[torch.Tensor]):
        try:
            return self.cache.run(key, run, tensors, keepalive=self.processor.captured_state())
        except RuntimeError as exc:
            self.failure = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
            self.cache.clear()
            log.warning("wamkit: whole-forward CUDA graphs are off from now on, their capture failed (%s); "
                        "the decoder stack still replays its own graphs", self.failure)
            torch.cuda.synchronize()
            return run(tensors)


def flatten_arguments(kwargs: dict) -> tuple[list[torch.Tensor], tuple]:
    """Keyword arguments -> (their tensors, in order, including those inside lists; a hashable
    structure holding everything else). `unflatten_arguments` inverts it."""
    tensors: list[torch.Tensor] = []

    def leaf(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return ("tensor",)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(leaf(v) for v in value))
        return ("value", value)

    return tensors, tuple((name, leaf(value)) for name, value in kwargs.items())


def unflatten_arguments(tensors: list[torch.Tensor], structure: tuple) -> dict:
    supply = iter(tensors)

    def build(node):
        kind = node[0]
        if kind == "tensor":
            return next(supply)
        if kind == "value":
            return node[1]
        items = [build(child) for child in node[1]]
        return items if kind == "list" else tuple(items)

    return {name: build(node) for name, node in structure}


def compile_pointwise(model, processor=None) -> int:
    """torch.compile the norms and MLPs of every decoder layer and the processor's rotary embedding
    (not the processor itself, whose text K/V cache keeps per-layer Python state): fuses the RMSNorm,
    SiLU-gate and rotation chains that otherwise run as a dozen unfused kernels per layer. Returns
    the number of modules compiled."""
    import torch._dynamo
    from diffusers.models.normalization import RMSNorm

    # One compiled code object serves every layer; each pathway and batch size is another shape.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if processor is not None and hasattr(processor, "rope"):
        processor.rope = torch.compile(processor.rope, dynamic=None)
    compiled = 0
    for layer in model.layers:
        for module in layer.modules():
            if isinstance(module, RMSNorm) or type(module).__name__ in ("Cosmos3VLTextMLP", "Cosmos3NemotronRMSNorm"):
                module.compile(dynamic=None)
                compiled += 1
    return compiled


def dynamo_compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far: dynamo's frame compiles (the forward
    graphs, inductor included) and the lazily compiled backward graphs."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(key, ())) for key in ("_compile.compile_inner", "backward._backward_impl"))
