"""Context parallelism: each packed sequence's tokens split across the `cp` ranks of the mesh.

One sample of a long bimanual clip is more activation than one GPU holds at Nano width, so the
decoder layers run on a slice of the tokens. Built on the two seams diffusers' Cosmos3 forward
leaves for it (`_cp_shard_fn` after the embeddings, `_cp_gather_fn` after the final norms) and on
the attention processor; the model code is untouched:

* shard: each pathway (text, generation) is padded to a multiple of k and cut into k contiguous
  slices; rank r keeps slice r of the hidden states and of the rotary tables. Every rank of a cp
  group holds the same samples, noise and full inputs (they are one data-parallel rank).
* attention (all-gather K/V): a rank projects q, k, v of its own tokens, gathers every rank's k and
  v (`gather_rows`: all_gather forward, summed reduce-scatter backward), and attends its queries
  over all keys with the mask rows of its queries (`attend_rows` of the dense or per-sample
  processor), so the cross-sample, causal-text and block-causal masks hold exactly as unsplit.
* gather: the layer outputs are gathered back (padding dropped) before the loss indexes them, so
  every rank of the group computes the same full loss.

Gradients: the gather's backward sums its incoming gradients over the group, so the k ranks of a
group together hold k times the group's gradient; FSDP2 shards over ("dp_shard", "cp") flattened
and averages over all dp x cp ranks, which leaves the mean over data-parallel groups, exactly as
without context parallelism (tests/train/test_context_parallel.py checks losses and gradients).

K/V are gathered whole per layer (k/heads of the activations: GQA keeps them small); ring
attention, which never holds all keys at once, is not implemented. Contiguous slices leave causal
text a little unbalanced (later ranks' queries see more keys); the generation tokens, most of the
sequence, attend bidirectionally or block-causally within their sample."""

from __future__ import annotations

import torch
import torch.distributed as dist

from wamkit.errors import ConfigError
from wamkit.model.attention import PackedAttention, PerSampleAttention


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0 (equal row counts); backward: sum the gradients over the group and
    keep this rank's rows (reduce-scatter; all-reduce + slice where the backend has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        grad = grad.contiguous()
        rows = grad.shape[0] // size
        if dist.get_backend(group) == "nccl":
            out = grad.new_empty((rows, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, group=group)
            return out, None
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad[rank * rows:(rank + 1) * rows], None


def gather_rows(x: torch.Tensor, group, total: int) -> torch.Tensor:
    """Every rank's slice of a padded sequence, in rank order, padding dropped: [total, ...]."""
    return _GatherRows.apply(x, group)[:total]


def _slice_rows(x: torch.Tensor, rank: int, degree: int) -> torch.Tensor:
    """Rank's contiguous slice of x's rows after zero-padding them to a multiple of degree."""
    rows = -(-x.shape[0] // degree)
    pad = rows * degree - x.shape[0]
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    return x[rank * rows:(rank + 1) * rows]


class ContextParallel:
    """The shard/gather seams of one model and the slice bookkeeping its attention reads."""

    def __init__(self, group):
        self.group = group
        self.rank, self.degree = dist.get_rank(group), dist.get_world_size(group)
        self.totals = {"und": 0, "gen": 0}

    def local_rows(self, pathway: str) -> tuple[int, int]:
        """[start, end) of this rank's real (unpadded) rows of a pathway, in full-sequence indexes."""
        total = self.totals[pathway]
        rows = -(-total // self.degree)
        start = min(self.rank * rows, total)
        return start, min(start + rows, total)

    def shard(self, und_seq, gen_seq, rotary_emb):
        self.totals = {"und": und_seq.shape[0], "gen": gen_seq.shape[0]}
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        r, k = self.rank, self.degree
        und_tables = tuple(_slice_rows(t, r, k) for t in (cos_und, sin_und))
        gen_tables = tuple(_slice_rows(t, r, k) for t in (cos_gen, sin_gen))
        return _slice_rows(und_seq, r, k), _slice_rows(gen_seq, r, k), (*und_tables, *gen_tables)

    def gather(self, und_out, gen_out):
        return (gather_rows(und_out, self.group, self.totals["und"]),
                gather_rows(gen_out, self.group, self.totals["gen"]))

    def gather_keys(self, x: torch.Tensor, pathway: str) -> torch.Tensor:
        return gather_rows(x, self.group, self.totals[pathway])


class ContextParallelAttention(PackedAttention):
    """The packed attention of `inner` (its masks, built over the full sequence by set_layout) for a
    rank that holds a slice of the queries: local q/k/v, gathered k/v, the mask rows of its queries.
    Training only: the text K/V cache of repeated denoising is refused."""

    def __init__(self, inner: PackedAttention, cp: ContextParallel):
        super().__init__()
        self.inner, self.cp = inner, cp
        self.rope = inner.rope

    def set_layout(self, und_ids, gen_ids, gen_chunk_ids=None) -> None:
        self.inner.set_layout(und_ids, gen_ids, gen_chunk_ids)
        self.und_mask = self.gen_mask = True  # marks "layout installed" for the base class check

    def clear(self) -> None:
        self.inner.clear()
        self.und_mask = self.gen_mask = None

    def start_text_cache(self, record: bool, text_length: int) -> None:
        raise ConfigError("parallel.context_parallel_degree", "context parallelism splits training forwards only",
                          "sample/serve with context_parallel_degree = 1")

    def __call__(self, attn, und_seq, gen_seq, rotary_emb):
        if self.und_mask is None:
            raise RuntimeError("ContextParallelAttention has no layout: run the forward inside `packed_layout(...)`")
        cos_und, sin_und, cos_gen, sin_gen = (r.unsqueeze(1) for r in rotary_emb)
        q_gen, k_gen, v_gen = self.project_gen(attn, gen_seq, cos_gen, sin_gen)
        q_und, k_und, v_und, k_und_for_gen = self.project_und(attn, und_seq, cos_und, sin_und)
        gather = self.cp.gather_keys
        k_und_all, v_und_all, k_gen_all, v_gen_all = (gather(k_und, "und"), gather(v_und, "und"),
                                                      gather(k_gen, "gen"), gather(v_gen, "gen"))
        k_for_gen_all = k_und_all if attn.k_norm_und_for_gen is None else gather(k_und_for_gen, "und")
        und_out = self._local(q_und, k_und_all, v_und_all, "und")
        gen_out = self._local(q_gen, torch.cat([k_for_gen_all, k_gen_all]), torch.cat([v_und_all, v_gen_all]), "gen")
        return attn.to_out(und_out), attn.to_add_out(gen_out)

    def _local(self, q, k, v, pathway: str) -> torch.Tensor:
        """This rank's real query rows attended; its padding rows (past the sequence end) get zeros."""
        start, end = self.cp.local_rows(pathway)
        width = q.shape[1] * q.shape[2]
        out = self.inner.attend_rows(q[:end - start], k, v, pathway, start) if end > start else q.new_zeros((0, width))
        pad = q.shape[0] - out.shape[0]
        return torch.cat([out, out.new_zeros((pad, width))]) if pad else out


def context_parallel_backend(choice: str, backend: str, degree: int) -> str:
    """The attention backend under context parallelism: the dense and per-sample processors can
    attend a slice of the queries; flex block masks cannot (yet), so auto picks per-sample."""
    if degree <= 1 or backend in ("sdpa", "per_sample"):
        return backend
    if choice == "auto":
        return "per_sample"
    raise ConfigError("model.attention", f"{choice!r} has no context-parallel path",
                      "use 'per_sample' (or 'sdpa' for tests) with parallel.context_parallel_degree > 1")


def enable_context_parallel(model, processor: PackedAttention, group) -> ContextParallelAttention:
    """Install the shard/gather seams and the slice-aware attention on a (sharded) Cosmos3 model."""
    if type(processor) not in (PackedAttention, PerSampleAttention):
        raise ConfigError("model.attention", "flex attention has no context-parallel path", "use 'per_sample'")
    cp = ContextParallel(group)
    wrapped = ContextParallelAttention(processor, cp)
    model.set_attn_processor(wrapped)
    model._cp_shard_fn, model._cp_gather_fn = cp.shard, cp.gather
    return wrapped
