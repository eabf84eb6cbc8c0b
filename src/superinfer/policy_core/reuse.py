"""Online reuse predictor for cached prefix nodes (DESIGN §6): P(a node is reused within a horizon).

The model is a logistic regression over a few per-node features, trained online by AdaGrad from
the cache's own access history with the label "accessed again within ``horizon_s``". The horizon
follows the cache's characteristic time (the mean age of the nodes it evicts), the time a node
stays cached under the current pressure; the label is the one Learning Relaxed Belady uses (Song
et al., "Learning Relaxed Belady for Content Distribution Network Caching", NSDI 2020). Until
enough labels exist the predictor scores like LRU (or LFU), and says so in :meth:`metrics`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FEATURE_NAMES",
    "NodeColumns",
    "NodeHistory",
    "ReusePredictor",
    "ReusePredictorConfig",
]

FloatArray = NDArray[np.float64]

#: Log2 bins of a node's age (time since its last access): [0, 1) s, [1, 2) s, ... [2048, inf) s.
_AGE_BINS = 12
#: SLO classes with an indicator feature each; later classes share the last one.
_MAX_CLASSES = 4
#: Dense (non-bin) features before the bias.
_NUM_DENSE = 9 + _MAX_CLASSES

FEATURE_NAMES: tuple[str, ...] = (
    *(f"age_bin{b}_first_use" for b in range(_AGE_BINS)),
    *(f"age_bin{b}_reused" for b in range(_AGE_BINS)),
    "log_accesses",
    "log_depth",
    "partial_block",
    "log_children",
    "has_interval",
    "log_interval",
    "age_over_interval",
    "log_since_first",
    "log_age",
    *(f"class{c}" for c in range(_MAX_CLASSES)),
    "bias",
)


@dataclass(frozen=True, slots=True)
class NodeColumns:
    """What the predictor reads about N nodes at one instant: one array per attribute, shape (N,).

    Attributes:
        age_s: time since the node's last access, in s (>= 0).
        since_first_s: time since the first access remembered for the node, in s (>= age_s).
        num_accesses: accesses remembered for it (>= 1), evictions notwithstanding.
        interval_ewma_s: EWMA of the gaps between its accesses, in s; NaN with one access.
        depth: nodes between the root and the node (0 for a child of the root).
        tokens_per_block: ``num_tokens / num_blocks`` of the node.
        num_children: cached child nodes (distinct continuations sharing this prefix).
        class_mask: shape (N, 4); 1 where a request of SLO class c touched the node (classes
            numbered in order of first appearance), or ``None`` when no class is known.
    """

    age_s: FloatArray
    since_first_s: FloatArray
    num_accesses: FloatArray
    interval_ewma_s: FloatArray
    depth: FloatArray
    tokens_per_block: FloatArray
    num_children: FloatArray
    class_mask: FloatArray | None = None

    def __len__(self) -> int:
        return int(self.age_s.shape[0])

    def take(self, idx: NDArray[np.int64]) -> NodeColumns:
        """The rows ``idx`` of every column."""
        return NodeColumns(
            age_s=self.age_s[idx],
            since_first_s=self.since_first_s[idx],
            num_accesses=self.num_accesses[idx],
            interval_ewma_s=self.interval_ewma_s[idx],
            depth=self.depth[idx],
            tokens_per_block=self.tokens_per_block[idx],
            num_children=self.num_children[idx],
            class_mask=None if self.class_mask is None else self.class_mask[idx],
        )


@dataclass(frozen=True, slots=True)
class ReusePredictorConfig:
    """Hyperparameters of :class:`ReusePredictor` (defaults chosen a priori, not tuned).

    Attributes:
        fallback: cold-start order, ``"lru"`` (score = -age) or ``"lfu"`` (score = accesses,
            ties by recency).
        min_labels: labels needed before the model replaces the fallback.
        min_labels_per_class: of those, at least this many positives and as many negatives.
        samples_per_call: nodes sampled as training examples per :meth:`ReusePredictor.learn`.
        learning_rate: AdaGrad step size (Duchi et al., JMLR 2011).
        l2: L2 penalty on the weights (not the bias).
        initial_horizon_s: label horizon before the first eviction measures the real one, in s.
        horizon_scale: horizon = this x the cache's characteristic time.
        horizon_smoothing: EWMA weight of each new eviction batch in the characteristic time.
        interval_weight: EWMA weight of the newest gap in a node's inter-access interval.
        max_pending: most unlabelled samples kept (oldest dropped first).
        seed: seed of the sampling.

    Raises:
        ValueError: on an unknown fallback or an out-of-range value.
    """

    fallback: str = "lru"
    min_labels: int = 1000
    min_labels_per_class: int = 50
    samples_per_call: int = 16
    learning_rate: float = 0.1
    l2: float = 1e-4
    initial_horizon_s: float = 60.0
    horizon_scale: float = 1.0
    horizon_smoothing: float = 0.01
    interval_weight: float = 0.5
    max_pending: int = 200_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.fallback not in ("lru", "lfu"):
            raise ValueError(f"fallback must be 'lru' or 'lfu', got {self.fallback!r}")
        for key in ("min_labels", "min_labels_per_class", "samples_per_call", "max_pending"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("learning_rate", "initial_horizon_s", "horizon_scale"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")
        for key in ("horizon_smoothing", "interval_weight"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        if self.l2 < 0:
            raise ValueError(f"l2 must be >= 0, got {self.l2}")


@dataclass(slots=True)
class _Pending:
    keys: NDArray[Any]
    sampled_s: float
    horizon_s: float
    bins: NDArray[np.int64]
    dense: FloatArray


class ReusePredictor:
    """Scores cached prefix nodes by how likely they are to be reused soon; learns online.

    Per placement decision: :meth:`learn` (labels the samples whose horizon has passed, one
    AdaGrad step per batch), :meth:`sample_indices` and :meth:`add_samples` (new examples), then
    :meth:`scores`; report the ages of evicted nodes with :meth:`observe_evictions`. Scoring N
    nodes is about 30 numpy vector operations of length N (no Python loop over nodes).

    Attributes:
        config: the hyperparameters.
        weights: shape (len(FEATURE_NAMES),), the logistic-regression weights.
    """

    def __init__(self, config: ReusePredictorConfig | None = None) -> None:
        self.config = config or ReusePredictorConfig()
        self.weights: FloatArray = np.zeros(len(FEATURE_NAMES))
        self._grad_sq: FloatArray = np.full(len(FEATURE_NAMES), 1e-8)
        self._wlist: list[float] | None = None  # weights as floats for score_one
        self._pending: deque[_Pending] = deque()
        self._num_pending = 0
        self._rng = np.random.default_rng(self.config.seed)
        self._block_tokens = 0.0
        self._char_time_s: float | None = None
        self.num_labels = 0
        self.num_positive = 0
        self.num_updates = 0
        self.switched_at_s: float | None = None
        self.labels_at_switch: int | None = None

    # ------------------------------------------------------------------ state

    @property
    def calibrated(self) -> bool:
        """True once the model replaced the cold-start fallback (scores are probabilities)."""
        return self.switched_at_s is not None

    @property
    def mode(self) -> str:
        """``"model"``, or ``"fallback_lru"`` / ``"fallback_lfu"`` during cold start."""
        return "model" if self.calibrated else f"fallback_{self.config.fallback}"

    @property
    def horizon_s(self) -> float:
        """Label horizon now, in s: ``horizon_scale`` x the characteristic time."""
        base = self._char_time_s if self._char_time_s is not None else None
        if base is None:
            return self.config.initial_horizon_s
        return max(self.config.horizon_scale * base, 1e-3)

    def metrics(self) -> dict[str, float | int | str | None]:
        """Counters for logs and reports: mode, labels, switch instant, horizon."""
        return {
            "mode": self.mode,
            "num_labels": self.num_labels,
            "num_positive": self.num_positive,
            "num_pending": self._num_pending,
            "num_updates": self.num_updates,
            "switched_at_s": self.switched_at_s,
            "labels_at_switch": self.labels_at_switch,
            "horizon_s": self.horizon_s,
        }

    # ------------------------------------------------------------------ features and scores

    def features(self, cols: NodeColumns) -> FloatArray:
        """The feature matrix, shape (N, len(FEATURE_NAMES)), columns as in :data:`FEATURE_NAMES`.

        Age enters as one-hot log2 bins, separately for nodes never reused and reused ones, so
        the model can learn a non-monotone hazard (a chat turn rarely returns within seconds).
        The other columns lie in [0, ~2]. (Scoring uses the same design without materializing
        the one-hot part.)
        """
        bins, dense = self._design(cols)
        x = np.zeros((len(cols), len(FEATURE_NAMES)))
        x[np.arange(len(cols)), bins] = 1.0
        x[:, 2 * _AGE_BINS : -1] = dense.T
        x[:, -1] = 1.0
        return x

    def _design(self, cols: NodeColumns) -> tuple[NDArray[np.int64], FloatArray]:
        """Age-bin index per node, shape (N,), and the dense features, shape (D, N)."""
        n = len(cols)
        age = np.maximum(cols.age_s, 0.0)
        bins = np.minimum(np.log2(1.0 + age).astype(np.int64), _AGE_BINS - 1)
        bins += _AGE_BINS * (cols.num_accesses > 1)
        dense = np.zeros((_NUM_DENSE, n))
        dense[0] = np.log1p(cols.num_accesses) / 4.0
        dense[1] = np.log1p(cols.depth) / 5.0
        # The block size is the largest tokens-per-block seen; a smaller node is a partial block.
        self._block_tokens = max(self._block_tokens, float(cols.tokens_per_block.max(initial=0.0)))
        dense[2] = cols.tokens_per_block < self._block_tokens
        dense[3] = np.log1p(cols.num_children) / 4.0
        has = ~np.isnan(cols.interval_ewma_s)
        interval = np.where(has, cols.interval_ewma_s, 1.0)
        dense[4] = has
        dense[5] = np.where(has, np.log1p(interval) / 8.0, 0.0)
        dense[6] = np.where(has, np.minimum(age / np.maximum(interval, 1.0), 10.0) / 10.0, 0.0)
        dense[7] = np.log1p(np.maximum(cols.since_first_s, 0.0)) / 8.0
        # Recency inside a bin: a bin is as wide as the ages it holds (2048 s and more in the
        # last), so without this the model could not order two old nodes by age as LRU does.
        dense[8] = np.log1p(age) / 8.0
        if cols.class_mask is not None:
            dense[9:] = cols.class_mask[:, :_MAX_CLASSES].T
        return bins, dense

    def _logit(self, bins: NDArray[np.int64], dense: FloatArray) -> FloatArray:
        # NOTE: no BLAS call: under a contended multithreaded BLAS a 37-wide gemv is slower
        # than these 13 vector updates.
        w = self.weights
        z: FloatArray = w[bins] + w[-1]
        for j in range(_NUM_DENSE):
            z += w[2 * _AGE_BINS + j] * dense[j]
        return z

    def scores(self, cols: NodeColumns) -> FloatArray:
        """Keep-priority of each node, shape (N,): higher = more worth keeping.

        Calibrated (:attr:`calibrated`): the predicted P(reused within :attr:`horizon_s`).
        Before that, the fallback's order: LRU ``-age_s``; LFU ``accesses + 1/(1+age_s)`` (more
        accesses first, then more recent). Only the order of fallback scores means anything.
        """
        if not self.calibrated:
            if self.config.fallback == "lru":
                return -np.asarray(cols.age_s, dtype=np.float64)
            return cols.num_accesses + 1.0 / (1.0 + np.maximum(cols.age_s, 0.0))
        return _sigmoid(self._logit(*self._design(cols)))

    def score_one(
        self,
        age_s: float,
        since_first_s: float,
        num_accesses: float,
        interval_ewma_s: float,
        depth: float,
        tokens_per_block: float,
        num_children: float,
    ) -> float:
        """:meth:`scores` of one node without an SLO class, in plain Python floats (a few µs,
        where a numpy call on one row costs tens): equal to ``scores(cols)[0]`` up to rounding.
        Arguments as the :class:`NodeColumns` fields (``interval_ewma_s`` NaN: one access)."""
        age = max(age_s, 0.0)
        if not self.calibrated:
            if self.config.fallback == "lru":
                return -float(age_s)
            return num_accesses + 1.0 / (1.0 + age)
        if self._wlist is None:
            self._wlist = self.weights.tolist()
        w = self._wlist
        if tokens_per_block > self._block_tokens:
            self._block_tokens = float(tokens_per_block)
        b = min(int(math.log2(1.0 + age)), _AGE_BINS - 1) + (_AGE_BINS if num_accesses > 1 else 0)
        d = 2 * _AGE_BINS
        z = w[b] + w[-1]
        z += w[d] * math.log1p(num_accesses) / 4.0
        z += w[d + 1] * math.log1p(depth) / 5.0
        if tokens_per_block < self._block_tokens:
            z += w[d + 2]
        z += w[d + 3] * math.log1p(num_children) / 4.0
        if interval_ewma_s == interval_ewma_s:  # not NaN
            z += w[d + 4]
            z += w[d + 5] * math.log1p(interval_ewma_s) / 8.0
            z += w[d + 6] * min(age / max(interval_ewma_s, 1.0), 10.0) / 10.0
        z += w[d + 7] * math.log1p(max(since_first_s, 0.0)) / 8.0
        z += w[d + 8] * math.log1p(age) / 8.0
        return 0.5 * (1.0 + math.tanh(0.5 * z))

    # ------------------------------------------------------------------ learning

    def learn(self, now_s: float, last_access_of: Callable[[NDArray[Any]], FloatArray]) -> None:
        """Label the samples whose horizon has passed and update the model with them.

        A sample of node k taken at ``t0`` with horizon ``h`` is labelled at the first call with
        ``now_s >= t0 + h``: positive iff ``last_access_of(k) > t0`` (an access in the lag between
        ``t0 + h`` and that call also counts; with calls far more frequent than ``h`` the bias is
        small). The model replaces the fallback, for good, at the first call after which
        ``num_labels >= min_labels`` with ``min_labels_per_class`` of each label.

        Args:
            now_s: current instant, in s (non-decreasing across calls).
            last_access_of: maps an array of keys to their latest access instants, in s
                (-inf, or anything <= t0, for keys no longer known).
        """
        while self._pending and self._pending[0].sampled_s + self._pending[0].horizon_s <= now_s:
            batch = self._pending.popleft()
            self._num_pending -= len(batch.keys)
            labels = (np.asarray(last_access_of(batch.keys)) > batch.sampled_s).astype(np.float64)
            self._update(batch.bins, batch.dense, labels)
        if not self.calibrated and self._ready():
            self.switched_at_s = now_s
            self.labels_at_switch = self.num_labels

    def sample_indices(self, num_nodes: int, calls: int = 1) -> NDArray[np.int64]:
        """Which of ``num_nodes`` candidate nodes to keep as training examples (distinct, at
        most ``calls x samples_per_call``), drawn from the predictor's seeded generator: sorted
        for one call; for ``calls > 1`` (the examples of that many decisions drawn at once) in
        random order, so that consecutive slices are uniform draws too."""
        take = min(self.config.samples_per_call * max(calls, 0), num_nodes)
        if take == 0:
            return np.zeros(0, dtype=np.int64)
        drawn = self._rng.choice(num_nodes, size=take, replace=False)
        return np.sort(drawn) if calls == 1 else drawn

    def add_samples(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, batches: int = 1
    ) -> None:
        """Keep these nodes, as they are at ``now_s``, as examples to label after the horizon.

        Args:
            keys: shape (M,), stable ids the caller's ``last_access_of`` understands.
            cols: their columns at ``now_s``.
            now_s: current instant, in s.
            batches: split them into this many batches of consecutive rows (one AdaGrad step
                each when labelled), as if added by that many calls (>= 1).
        """
        if len(keys) == 0:
            return
        bins, dense = self._design(cols)
        keys = np.asarray(keys)
        edges = np.linspace(0, len(keys), min(max(batches, 1), len(keys)) + 1).astype(np.int64)
        for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
            self._pending.append(
                _Pending(keys[lo:hi], now_s, self.horizon_s, bins[lo:hi], dense[:, lo:hi])
            )
        self._num_pending += len(keys)
        while self._num_pending > self.config.max_pending:
            self._num_pending -= len(self._pending.popleft().keys)

    def observe_evictions(self, ages_s: FloatArray) -> None:
        """Update the characteristic time with the ages (s since last access) of evicted nodes."""
        if len(ages_s) == 0:
            return
        mean_age = float(np.mean(ages_s))
        if self._char_time_s is None:
            self._char_time_s = mean_age
        else:
            w = self.config.horizon_smoothing
            self._char_time_s = (1.0 - w) * self._char_time_s + w * mean_age

    def _ready(self) -> bool:
        cfg = self.config
        negatives = self.num_labels - self.num_positive
        return (
            self.num_labels >= cfg.min_labels
            and self.num_positive >= cfg.min_labels_per_class
            and negatives >= cfg.min_labels_per_class
        )

    def _update(self, bins: NDArray[np.int64], dense: FloatArray, y: FloatArray) -> None:
        n = len(y)
        if n == 0:
            return
        resid = _sigmoid(self._logit(bins, dense)) - y
        grad = np.empty_like(self.weights)
        grad[: 2 * _AGE_BINS] = np.bincount(bins, weights=resid, minlength=2 * _AGE_BINS) / n
        grad[2 * _AGE_BINS : -1] = (dense * resid).sum(axis=1) / n
        grad[-1] = resid.mean()
        grad[:-1] += self.config.l2 * self.weights[:-1]
        self._grad_sq += grad * grad
        self.weights -= self.config.learning_rate * grad / np.sqrt(self._grad_sq)
        self._wlist = None
        self.num_labels += n
        self.num_positive += int(y.sum())
        self.num_updates += 1


def _sigmoid(z: FloatArray) -> FloatArray:
    out: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic
    return out


@dataclass(slots=True)
class NodeHistory:
    """Access history of prefix nodes by id, kept across evictions (a bounded ghost table).

    Engines report each node's ``last_access_s`` and ``hit_count``; a newer ``last_access_s``
    than remembered counts as an access. When more than ``max_keys`` ids are remembered, the
    least recently accessed half is forgotten (amortized O(1) per id).

    Attributes:
        max_keys: most ids remembered.
        interval_weight: EWMA weight of the newest gap between accesses.
    """

    max_keys: int = 1_000_000
    interval_weight: float = 0.5
    _slot: dict[str, int] = field(default_factory=dict)
    _last: FloatArray = field(default_factory=lambda: np.zeros(0))
    _first: FloatArray = field(default_factory=lambda: np.zeros(0))
    _count: FloatArray = field(default_factory=lambda: np.zeros(0))
    _hits: FloatArray = field(default_factory=lambda: np.zeros(0))
    _interval: FloatArray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.max_keys < 2:
            raise ValueError(f"max_keys must be >= 2, got {self.max_keys}")

    def __len__(self) -> int:
        return len(self._slot)

    def update(
        self, keys: Sequence[str], last_access_s: Iterable[float], hit_counts: Iterable[int]
    ) -> NDArray[np.int64]:
        """Record what the engine reports now; returns the slots of ``keys``, shape (N,).

        Slots stay valid until the next call (a later call may forget and reuse them).
        """
        last = np.fromiter(last_access_s, dtype=np.float64, count=len(keys))
        hits = np.fromiter(hit_counts, dtype=np.float64, count=len(keys))
        if len(self._slot) + len(keys) > self.max_keys:
            self._forget(keep=max(self.max_keys // 2, self.max_keys - len(keys)))
        slots = np.empty(len(keys), dtype=np.int64)
        fresh: list[int] = []
        for i, key in enumerate(keys):
            slot = self._slot.get(key)
            if slot is None:
                slot = len(self._slot)
                self._slot[key] = slot
                fresh.append(i)
            slots[i] = slot
        self._grow(len(self._slot))
        if fresh:
            f = np.asarray(fresh)
            s = slots[f]
            self._last[s], self._first[s] = last[f], last[f]
            self._count[s], self._hits[s] = 1.0 + hits[f], hits[f]
            self._interval[s] = np.nan
        newer = last > self._last[slots]
        if newer.any():
            s, t = slots[newer], last[newer]
            gap = t - self._last[s]
            w = self.interval_weight
            old = self._interval[s]
            self._interval[s] = np.where(np.isnan(old), gap, w * gap + (1.0 - w) * old)
            self._count[s] += np.maximum(1.0, hits[newer] - self._hits[s])
            self._last[s] = t
        self._hits[slots] = np.maximum(self._hits[slots], hits)
        return slots

    def last_access_of(self, keys: NDArray[Any]) -> FloatArray:
        """Latest access instants of ``keys`` (ids), -inf for ids not remembered."""
        return np.array(
            [self._last[s] if (s := self._slot.get(k)) is not None else -math.inf for k in keys],
            dtype=np.float64,
        )

    def columns(
        self,
        slots: NDArray[np.int64],
        now_s: float,
        *,
        depth: FloatArray,
        tokens_per_block: FloatArray,
        num_children: FloatArray,
        class_mask: FloatArray | None = None,
    ) -> NodeColumns:
        """The predictor's columns for ``slots`` at ``now_s`` (other columns passed through)."""
        return NodeColumns(
            age_s=np.maximum(now_s - self._last[slots], 0.0),
            since_first_s=np.maximum(now_s - self._first[slots], 0.0),
            num_accesses=self._count[slots].copy(),
            interval_ewma_s=self._interval[slots].copy(),
            depth=depth,
            tokens_per_block=tokens_per_block,
            num_children=num_children,
            class_mask=class_mask,
        )

    def _grow(self, size: int) -> None:
        if size <= len(self._last):
            return
        cap = max(size, 2 * len(self._last), 1024)
        for name in ("_last", "_first", "_count", "_hits", "_interval"):
            old = getattr(self, name)
            new = np.zeros(cap)
            new[: len(old)] = old
            setattr(self, name, new)

    def _forget(self, keep: int) -> None:
        keys = list(self._slot)
        old = np.fromiter(self._slot.values(), dtype=np.int64, count=len(keys))
        order = np.argsort(self._last[old], kind="stable")[len(keys) - keep :]
        kept = old[order]
        for name in ("_last", "_first", "_count", "_hits", "_interval"):
            arr = getattr(self, name)
            setattr(self, name, arr[kept].copy())
        self._slot = {keys[i]: new for new, i in enumerate(order.tolist())}
