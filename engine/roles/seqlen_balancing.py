"""Balanced partitions of sequences by length: token-budget micro-batches, balanced ranks and
length buckets.

After verl's ``verl/utils/seqlen_balancing.py``. Three users:

- **Dynamic micro-batches** (``use_dynamic_bsz``): a rank's rows are cut into the fewest
  micro-batches whose tokens (a row's tokens = its ``attention_mask`` sum) fit the budget
  (``*_max_token_len_per_gpu``), as evenly as the Karmarkar-Karp heuristic manages. verl takes
  ``ceil(total / budget)`` parts and lets a part run over the budget when the partition is uneven;
  here the count grows until every part fits, so the budget is a hard memory bound. A row longer
  than the budget is refused, as verl refuses it. Data-parallel ranks run the same number of
  micro-batches (the most any rank needs), since every FSDP forward is a collective.
- **Balanced ranks** (``trainer.balance_batch``): the controller reorders the batch so that each
  rank's contiguous share holds nearly the same work, with ``equal_size`` partitions so every
  rank keeps the same row count; ``global_seqlen/*`` metrics say how uneven it was and is.
- **Length buckets** (:func:`length_buckets`): the actor's padded forward and the packed
  attention (``engine.roles.packing``) run rows of similar length together, each bucket cut to
  its longest row, so little of their work is padding (a dynamic programme over the sorted
  lengths).

The first two partition with the Largest Differencing Method (Karmarkar and Karp, "The differencing method
of set partitioning", 1982; https://en.wikipedia.org/wiki/Largest_differencing_method): keep
states of ``k`` sets, repeatedly merge the two states whose spread (largest minus smallest sum) is
largest, pairing the largest set of one with the smallest of the other.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
import torch.distributed as dist

from engine.data import DataProto


def calculate_workload(seqlens: torch.Tensor) -> torch.Tensor:
    """Return verl's relative compute of each sequence: ``24576 * s + s**2`` (s = its tokens).

    The dense-layer term ``12 h^2 s`` and the attention term ``2 h s^2`` of a transformer with
    ``h = 4096``, divided by ``2 h``. Shapes: ``(n,)`` -> ``(n,)``.
    """
    seqlens = seqlens.long()
    return 24576 * seqlens + seqlens**2


class _State:
    """``k`` sets of item indices with their sums, kept ordered from largest to smallest sum."""

    def __init__(self, items: Sequence[tuple[int, int]], k: int) -> None:
        self.sums = [0] * k
        self.items: list[list[int]] = [[] for _ in range(k)]
        for slot, (index, value) in enumerate(items):
            self.sums[slot] += value
            self.items[slot].append(index)
        self._sort()

    def _sort(self) -> None:
        order = sorted(range(len(self.sums)), key=lambda s: (self.sums[s], len(self.items[s])))
        order.reverse()
        self.sums = [self.sums[s] for s in order]
        self.items = [self.items[s] for s in order]

    @property
    def spread(self) -> int:
        return self.sums[0] - self.sums[-1]

    def merge(self, other: _State) -> None:
        """Pair this state's largest set with the other's smallest, and so on down."""
        k = len(self.sums)
        for slot in range(k):
            self.sums[slot] += other.sums[k - 1 - slot]
            self.items[slot].extend(other.items[k - 1 - slot])
        self._sort()

    def key(self, counter: int) -> tuple[int, int, int]:
        # heapq pops the smallest key: the largest spread, then the largest set, then the oldest.
        return (-self.spread, -self.sums[0], counter)


def karmarkar_karp(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """Return ``k`` lists of indices into ``values`` whose sums are nearly equal.

    With ``equal_size`` every list gets ``len(values) / k`` items: the sorted values are taken
    ``k`` at a time, one per set, before the differencing starts.
    """
    ordered = sorted((int(value), index) for index, value in enumerate(values))
    if equal_size:
        starts = [
            [(index, value) for value, index in ordered[i : i + k]]
            for i in range(0, len(ordered), k)
        ]
    else:
        starts = [[(index, value)] for value, index in ordered]
    heap: list[tuple[tuple[int, int, int], _State]] = []
    counter = 0
    for items in starts:
        state = _State(items, k)
        heapq.heappush(heap, (state.key(counter), state))
        counter += 1
    while len(heap) > 1:
        _, first = heapq.heappop(heap)
        _, second = heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, (first.key(counter), first))
        counter += 1
    return heap[0][1].items


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """Return ``k_partitions`` non-empty, sorted index lists covering ``seqlen_list`` once.

    verl's name and contract: the sums of ``seqlen_list`` over the partitions are balanced by
    Karmarkar-Karp; ``equal_size`` gives every partition ``len / k`` items. ValueError when there
    are fewer items than partitions, or ``equal_size`` and the length does not divide.
    """
    n = len(seqlen_list)
    if k_partitions < 1 or n < k_partitions:
        raise ValueError(f"cannot split {n} sequences into {k_partitions} non-empty partitions")
    if equal_size and n % k_partitions:
        raise ValueError(
            f"cannot split {n} sequences into {k_partitions} partitions of equal size; "
            f"make the batch a multiple of {k_partitions}"
        )
    partitions = [sorted(p) for p in karmarkar_karp(seqlen_list, k_partitions, equal_size)]
    assert all(partitions) and sorted(i for p in partitions for i in p) == list(range(n))
    return partitions


def log_seqlen_unbalance(
    seqlen_list: Sequence[int], partitions: list[list[int]], prefix: str = "global_seqlen"
) -> dict[str, float]:
    """Return verl's balance metrics: per-rank token sums before and after partitioning.

    ``{prefix}/min``, ``/max``, ``/minmax_diff``: the sums of the contiguous equal shares the
    ranks would get without reordering; ``/balanced_min``, ``/balanced_max``: the sums of
    ``partitions``; ``/mean``: the total divided by the number of partitions.
    """
    k = len(partitions)
    share = len(seqlen_list) // k
    before = [sum(seqlen_list[i * share : (i + 1) * share]) for i in range(k)]
    after = [sum(seqlen_list[i] for i in partition) for partition in partitions]
    return {
        f"{prefix}/min": float(min(before)),
        f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)),
        f"{prefix}/balanced_max": float(max(after)),
        f"{prefix}/mean": float(sum(seqlen_list)) / k,
    }


def balanced_order(
    attention_mask: torch.Tensor, dp_size: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the row order that gives each of ``dp_size`` ranks nearly equal work, and metrics.

    Rows are partitioned by :func:`calculate_workload` of their tokens into ``dp_size`` equal-size
    sets (verl's ``_balance_batch``); rank ``r`` gets set ``r`` as its contiguous share, each set
    in batch order. Groups of a prompt are not kept together (neither does verl). One rank gets
    the identity order: its only set is the whole batch. Shapes: attention_mask ``(bs, T)`` ->
    order ``(bs,)``; metrics as :func:`log_seqlen_unbalance` over the rows' tokens.
    """
    seqlens = attention_mask.sum(-1)  # (bs,)
    if dp_size == 1:
        partitions = [list(range(len(seqlens)))]
    else:
        workloads = calculate_workload(seqlens).tolist()
        partitions = get_seqlen_balanced_partitions(workloads, dp_size, equal_size=True)
    order = torch.tensor([i for partition in partitions for i in partition], dtype=torch.long)
    return order, log_seqlen_unbalance(seqlens.tolist(), partitions)


def dynamic_micro_batches(
    attention_mask: torch.Tensor,
    max_token_len: int,
    key: str,
    dp_group: dist.ProcessGroup | None = None,
) -> list[list[int]]:
    """Return index lists of micro-batches of at most ``max_token_len`` tokens each.

    A row's tokens are its ``attention_mask`` sum. The count starts at
    ``ceil(total / max_token_len)``, is raised to the largest any data-parallel rank needs
    (an all-reduce over ``dp_group`` when torch.distributed is initialised with more than one
    rank), and then grows until a balanced partition fits every part under the budget. ValueError
    naming ``key`` when one row alone is over the budget. Shapes: attention_mask ``(bs, T)``.
    """
    seqlens = attention_mask.sum(-1).tolist()  # (bs,) tokens per row
    longest = max(seqlens, default=0)
    if longest > max_token_len:
        raise ValueError(
            f"{key}={max_token_len} is smaller than a sequence of {longest} tokens (prompt + "
            f"response); set it to at least {longest} (data.max_prompt_length + "
            "data.max_response_length holds any sequence), or turn off use_dynamic_bsz"
        )
    count = min(len(seqlens), max(1, -(-sum(seqlens) // max_token_len)))
    while True:
        count = _most_over_ranks(count, attention_mask.device, dp_group)
        parts = get_seqlen_balanced_partitions(seqlens, count, equal_size=False)
        fits = all(sum(seqlens[i] for i in part) <= max_token_len for part in parts)
        # One row per part always fits, so the loop ends by count == bs at the latest.
        if _all_ranks(fits, attention_mask.device, dp_group):
            return parts
        count += 1


def _distributed(dp_group: dist.ProcessGroup | None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(dp_group) > 1


def _most_over_ranks(value: int, device: torch.device, dp_group: dist.ProcessGroup | None) -> int:
    """Return the largest ``value`` over the data-parallel ranks (``value`` on one rank)."""
    if not _distributed(dp_group):
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=dp_group)
    return int(tensor.item())


def _all_ranks(flag: bool, device: torch.device, dp_group: dist.ProcessGroup | None) -> bool:
    """Return True when ``flag`` holds on every data-parallel rank."""
    if not _distributed(dp_group):
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=dp_group)
    return bool(tensor.item())


def agree_call_plan(
    buckets: int,
    rows: int,
    shared_prompts: bool,
    device: torch.device,
    dp_group: dist.ProcessGroup | None = None,
) -> tuple[int, bool]:
    """Return the length-bucket count and shared-prompt choice every data-parallel rank uses.

    Each rank brings what its own micro-batch would use: ``buckets`` (from
    :func:`length_buckets`), its ``rows``, whether its rows share prompts. The plan is the most
    buckets any rank wants, but no more than the fewest rows any rank holds, and the shared
    prompt pass only where every rank can run it. Under FSDP2 every forward call is a
    collective, so ranks that made different calls would wait for each other forever. One
    all-reduce; one rank keeps its own plan.
    """
    if not _distributed(dp_group):
        return buckets, shared_prompts
    tensor = torch.tensor([buckets, -rows, -int(shared_prompts)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=dp_group)
    most, fewest_rows, every_shares = (int(value) for value in tensor.tolist())
    return min(most, -fewest_rows), every_shares == -1


def split_micro_batches(
    data: DataProto,
    micro_batch_size: int,
    max_token_len: int | None = None,
    key: str = "max_token_len_per_gpu",
) -> tuple[list[DataProto], torch.Tensor | None]:
    """Return the micro-batches of ``data`` and the row order they hold (None: batch order).

    ``micro_batch_size`` rows each, in order, when ``max_token_len`` is None; otherwise the
    token-budget micro-batches of :func:`dynamic_micro_batches` (``key`` names the budget in its
    error). Put outputs back with :func:`restore_order`.
    """
    if max_token_len is None:
        return data.split(micro_batch_size), None
    parts = dynamic_micro_batches(data.batch["attention_mask"], max_token_len, key)
    order = torch.tensor([i for part in parts for i in part], dtype=torch.long)
    return [data[part] for part in parts], order  # type: ignore[misc]


def restore_order(outputs: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Return ``outputs`` (bs, ...) of rows in ``order`` back in batch order."""
    if order is None:
        return outputs
    return outputs[torch.argsort(order).to(outputs.device)]


def length_buckets(
    lengths: torch.Tensor,
    response_length: int,
    max_buckets: int = 4,
    min_saving: float = 0.05,
    *,
    count: int | None = None,
) -> list[tuple[torch.Tensor, int]]:
    """Split rows by response length (bs,) into buckets; return ``(rows, longest)`` per bucket.

    Buckets are contiguous runs of the rows sorted by length, chosen (dynamic programming over at
    most 32 candidate cuts) to minimise the padded tokens ``sum(rows x longest)``. Every bucket
    costs a forward call, so each one past the first must save at least ``min_saving`` of the
    unsplit batch's tokens and four tokens a row: on a small model a call's fixed cost is worth
    many tokens.

    ``count`` (at most bs) asks for exactly that many buckets, the cheapest split into them:
    ranks that agreed on a count (:func:`agree_call_plan`) make the same forward calls. Where
    the rows have fewer distinct lengths than that, rows of one length share out over buckets.
    """
    bs = lengths.shape[0]
    if count is not None and not 1 <= count <= bs:
        raise ValueError(f"cannot split {bs} rows into exactly {count} length buckets")
    longest = max(1, min(response_length, int(lengths.max())))
    whole = [(torch.arange(bs, device=lengths.device), longest)]
    if count == 1:
        return whole
    sorted_lengths, order = torch.sort(lengths.clamp(min=1, max=longest))
    values = sorted_lengths.tolist()
    cuts = [j for j in range(1, bs) if values[j - 1] < values[j]]  # where the length changes
    if count is not None and len(cuts) < count - 1:
        cuts = list(range(1, bs))  # too few lengths: any row may start a bucket
    if not cuts:
        return whole
    if len(cuts) > 32:
        cuts = [cuts[round(i * (len(cuts) - 1) / 31)] for i in range(32)]
    points = [0, *cuts, bs]  # bucket boundaries to choose from
    penalty = max(min_saving * bs * longest, 4.0 * bs)
    if count is not None:
        max_buckets, penalty = count, 0.0  # the count is fixed: no call to save
    inf = float("inf")
    # best[k][b]: least cost of the rows before points[b] in k buckets; prev[k][b]: the last cut
    best = [[inf] * len(points) for _ in range(max_buckets + 1)]
    prev = [[0] * len(points) for _ in range(max_buckets + 1)]
    best[0][0] = 0.0
    for k in range(1, max_buckets + 1):
        for b in range(1, len(points)):
            for a in range(b):
                if best[k - 1][a] == inf:
                    continue
                rows = points[b] - points[a]
                cost = best[k - 1][a] + rows * values[points[b] - 1] + (penalty if k > 1 else 0)
                if cost < best[k][b]:
                    best[k][b], prev[k][b] = cost, a
    end = len(points) - 1
    k = count or min(range(1, max_buckets + 1), key=lambda n: best[n][end])
    if k == 1:
        return whole
    buckets = []
    while k > 0:
        a = prev[k][end]
        buckets.append((order[points[a] : points[end]], int(values[points[end] - 1])))
        end, k = a, k - 1
    return buckets[::-1]
