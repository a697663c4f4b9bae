"""Token-budget packing: group consecutive samples into packed sequences of at most `max_tokens`."""

from __future__ import annotations

from typing import Sequence

from wamkit.errors import DataError


def pack_by_token_budget(token_counts: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Greedy, order-preserving: sample indices in order, a new group whenever the next sample would
    exceed `max_tokens`. A sample is never split; one larger than the budget is an error."""
    if max_tokens < 1:
        raise DataError("pack_by_token_budget: max_tokens", f"is {max_tokens}", "use a positive token budget")
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(token_counts):
        n = int(n)
        if n < 0:
            raise DataError(f"pack_by_token_budget: token_counts[{i}]", f"is {n}", "token counts are >= 0")
        if n > max_tokens:
            raise DataError(f"pack_by_token_budget: token_counts[{i}]", f"sample has {n} tokens, more than the "
                            f"budget of {max_tokens}", "raise the token budget or shorten/downscale the sample")
        if current and used + n > max_tokens:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        groups.append(current)
    return groups
