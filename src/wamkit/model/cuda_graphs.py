"""CUDA-graph replay of the decoder stack for inference.

At serving batch sizes a denoising forward is a few hundred tokens through 36 layers: thousands of
small kernels whose launch cost exceeds their run time. The decoder stack (the whole cost; the
embeddings and heads around it are a handful of kernels) is captured once per distinct shape and
replayed. A captured graph reads fixed addresses, so everything it reads must be stable between
replays: the inputs are copied into static buffers, the attention masks come from the processor's
per-layout cache, and the recorded text K/V live in the processor's persistent buffers."""

from __future__ import annotations

from collections import OrderedDict

import torch


class DecoderStackGraphs:
    """Replaces `model._run_decoder_stack` on one CUDA model. Keyed by the installed layout, the
    text-cache mode and the input shapes; least recently used graphs beyond `max_graphs` are freed."""

    def __init__(self, model, processor, max_graphs: int = 16, warmup_runs: int = 2):
        if not next(model.parameters()).is_cuda:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.processor = model, processor
        self.max_graphs, self.warmup_runs = max_graphs, warmup_runs
        self._plain = model._run_decoder_stack
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()
        model._run_decoder_stack = self
        self.captures = 0

    def remove(self) -> None:
        """Back to the plain decoder stack (frees every graph)."""
        self.model._run_decoder_stack = self._plain
        self._graphs.clear()

    def __call__(self, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb: tuple):
        if torch.is_grad_enabled():
            return self._plain(und_seq, gen_seq, rotary_emb)
        layout = getattr(self.processor, "layout_key", None)
        if layout is None:  # no cacheable layout installed: nothing stable to capture against
            return self._plain(und_seq, gen_seq, rotary_emb)
        key = (layout, getattr(self.processor, "text_cache", "off"), tuple(und_seq.shape), tuple(gen_seq.shape), und_seq.dtype)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(und_seq, gen_seq, rotary_emb)
            self._graphs[key] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        graph, static_in, static_out, _keepalive = entry
        for dst, src in zip(static_in, (und_seq, gen_seq, *rotary_emb)):
            dst.copy_(src)
        graph.replay()
        return static_out

    def _run(self, inputs: list[torch.Tensor]):
        rewind = getattr(self.processor, "rewind_text_cache", None)
        if rewind is not None:
            rewind()
        return self._plain(inputs[0], inputs[1], tuple(inputs[2:]))

    def _capture(self, und_seq, gen_seq, rotary_emb):
        static_in = [t.clone() for t in (und_seq, gen_seq, *rotary_emb)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: compiles kernels, allocates text K/V buffers
            for _ in range(self.warmup_runs):
                self._run(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._run(static_in)
        self.captures += 1
        return graph, static_in, static_out, self.processor.captured_state()
