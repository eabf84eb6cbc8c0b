"""KV movement on one replica: finding HBM blocks (eviction, the placement plugin's answer,
waiting for copies in flight), offload and prefetch of prefix-cache nodes, caching a finished
prompt, releasing a request's KV, and swapping a request out to CPU and back.

Every copy goes through the replica's :class:`~superinfer.sim.kv.Link`; a swap-out frees its HBM
pages only when its copy ends (``Replica.transits``)."""

from __future__ import annotations

from typing import Any

from superinfer.policy_core.types import KVLocation, KVPrecision, Placement
from superinfer.policy_core.validation import check_placement
from superinfer.sim.kv import Node
from superinfer.sim.replica import Replica
from superinfer.sim.request import RequestStatus, SimRequest

__all__ = ["KVMovement"]


class KVMovement:
    """Allocation and copies of KV blocks, for every replica of one simulation.

    Args:
        hook: the plugin manager's hook relay; ``superinfer_kv_placement`` is asked before the
            engine evicts by its own order.
        placement_enabled: whether any plugin implements ``superinfer_kv_placement`` (else the
            hook is never called).
    """

    def __init__(self, hook: Any, placement_enabled: bool) -> None:
        self.hook = hook
        self.placement_enabled = placement_enabled

    def allocate(self, rep: Replica, blocks: int, now_s: float) -> float | None:
        """Make ``blocks`` HBM blocks free for the caller to take.

        Evicts prefix-cache nodes (placement plugin first, then the engine's own order) and, if
        still short, waits for swap-outs in flight.

        Returns:
            The instant the blocks are free (``now_s`` or the end of a copy), or ``None`` if they
            cannot be found.
        """
        if blocks <= rep.free_blocks:
            return now_s
        self._evict(rep, blocks - rep.free_blocks, now_s)
        if blocks <= rep.free_blocks:
            return now_s
        short = blocks - rep.free_blocks
        for end, freed in sorted(rep.transits):
            short -= freed
            if short <= 0:
                rep.release_transits(end)  # the caller takes these blocks once the copy ends
                return end
        return None

    def _evict(self, rep: Replica, blocks: int, now_s: float) -> None:
        """Take at least ``blocks`` HBM blocks from unused prefix-cache nodes, if there are any:
        the placement plugin's decision first, then the engine's own order among unpinned
        nodes."""
        cache = rep.cache
        freed = self._placement(rep, blocks, now_s) if self.placement_enabled else 0
        while freed < blocks:
            node = cache.pop_victim()
            if node is None:
                return
            freed += self._leave_hbm(rep, node, now_s, offload=True)

    def _placement(self, rep: Replica, needed: int, now_s: float) -> int:
        """Ask ``superinfer_kv_placement`` about every cached node and apply its answer (drop,
        offload, prefetch, then the new pin set); the HBM blocks it freed."""
        cache = rep.cache
        if not cache.nodes:
            return 0
        waiting_refs: dict[int, int] = {}
        for req in (*rep.waiting.values(), *rep.swapped.values()):
            for key in req.spec.block_hashes:
                if key not in cache.nodes:
                    break
                waiting_refs[key] = waiting_refs.get(key, 0) + 1
        views = tuple(n.view(waiting_refs.get(k, 0)) for k, n in cache.nodes.items())
        decision = self.hook.superinfer_kv_placement(
            nodes=views, now_s=now_s, free_hbm_blocks=rep.free_blocks,
            free_cpu_blocks=rep.cpu_free_blocks, needed_hbm_blocks=needed,
            total_hbm_blocks=rep.total_blocks,
        )  # fmt: skip
        if decision is None:
            return 0
        check_placement(views, decision, has_cpu_tier=rep.cpu_total_blocks > 0)
        by_id = {str(k): n for k, n in cache.nodes.items()}
        freed = 0
        for wanted in (Placement.DROP, Placement.OFFLOAD):
            chosen = [by_id[i] for i, a in decision.actions.items() if a is wanted]
            for node in sorted(chosen, key=lambda n: (-n.depth, n.key)):  # leaves first
                if node.key not in cache.nodes:
                    continue  # went with a dropped ancestor
                if node.location is KVLocation.HBM:
                    freed += self._leave_hbm(rep, node, now_s, offload=wanted is Placement.OFFLOAD)
                elif wanted is Placement.DROP:
                    cache.drop_cpu(node)
        for node_id in decision.prefetch:
            node = by_id[node_id]
            if node.key in cache.nodes and node.location is KVLocation.CPU:
                if node.blocks > rep.free_blocks:
                    break  # prefetch only into free memory, never by evicting
                cache.onboard(node)
                rep.link.transfer("h2d", node.blocks * rep.kv_block_bytes, now_s)
        pins = {i for i, a in decision.actions.items() if a is Placement.PIN}
        for key, node in cache.nodes.items():
            cache.set_pinned(node, str(key) in pins)
        return freed

    def _leave_hbm(self, rep: Replica, node: Node, now_s: float, *, offload: bool) -> int:
        """Offload ``node`` to CPU if asked and possible (else drop it); the HBM blocks freed."""
        cache = rep.cache
        offload = (
            offload and rep.cpu_total_blocks > 0 and node.priority >= cache.offload_min_priority
        )
        while offload and rep.cpu_free_blocks < node.blocks:
            victim = cache.pop_cpu_victim()
            if victim is None:
                offload = False
            else:
                cache.drop_cpu(victim)
        if offload:
            rep.link.transfer("d2h", node.blocks * rep.kv_block_bytes, now_s)
        cache.leave_hbm(node, offload=offload)
        return node.blocks

    def insert_prefix(self, rep: Replica, req: SimRequest, now_s: float) -> None:
        """A request finished its prefill: cache its prompt's hashed blocks (its pages become the
        cache's; the request keeps them locked)."""
        spec = req.spec
        if not spec.block_hashes or req.precision is not KVPrecision.FP16:
            return  # the cache holds FP16 KV; quantized requests reuse it but do not add to it
        cache = rep.cache
        parent = req.nodes[-1] if req.nodes else None
        for index in range(len(req.nodes), len(spec.block_hashes)):
            key = spec.block_hashes[index]
            tokens = cache.node_tokens(spec.prompt_tokens, index, spec.hash_block_tokens)
            if tokens == 0 or key in cache.nodes:
                break  # a partial page, or another request cached it first: keep ours private
            node = cache.insert(key, parent, tokens, now_s, slo=spec.slo.name)
            req.nodes.append(node)
            req.shared_blocks += node.blocks
            rep.add_own(req, -node.blocks)
            req.reserve_blocks = max(0, req.reserve_blocks - node.blocks)
            parent = node

    def release(self, rep: Replica, req: SimRequest, now_s: float) -> None:
        """Give back ``req``'s HBM KV: unlock its prefix nodes, free its own blocks."""
        rep.cache.unlock(req.nodes, now_s)
        req.nodes = []
        req.shared_blocks = 0
        req.reserve_blocks = 0
        rep.add_own(req, -req.own_blocks)
        req.location = KVLocation.UNALLOCATED
        req.touch()

    def swap_out(self, rep: Replica, req: SimRequest, now_s: float) -> bool:
        """Copy ``req``'s KV to CPU; its HBM pages free when the copy ends.

        Returns:
            ``False`` (and nothing changed but dropped CPU cache nodes) when the CPU tier has no
            room even after dropping every droppable cached node: the caller recomputes instead.
        """
        blocks = rep.blocks_for(req, req.computed_tokens)
        while rep.cpu_free_blocks < blocks:
            victim = rep.cache.pop_cpu_victim()
            if victim is None:  # cached CPU nodes with children cannot go first
                return False
            rep.cache.drop_cpu(victim)
        end = rep.link.transfer("d2h", blocks * rep.kv_block_bytes, max(now_s, req.ready_s))
        own = req.own_blocks
        rep.add_own(req, -own)
        rep.transits.append((end, own))
        rep.cache.unlock(req.nodes, now_s)
        req.nodes = []
        req.shared_blocks = 0
        req.reserve_blocks = 0
        req.own_blocks = blocks
        rep.own_cpu_blocks += blocks
        req.location = KVLocation.CPU
        req.ready_s = end  # its KV is in CPU memory from here on
        req.status = RequestStatus.SWAPPED
        rep.swapped[req.request_id] = req
        return True

    def swap_in(self, rep: Replica, req: SimRequest, now_s: float) -> float | None:
        """Copy a swapped request's KV back to HBM (no-op if already there); when it lands."""
        if req.location is KVLocation.HBM:
            return req.ready_s
        blocks = req.own_blocks
        when = self.allocate(rep, blocks, now_s)
        if when is None:
            return None
        rep.own_cpu_blocks -= blocks
        req.own_blocks = 0
        rep.add_own(req, blocks)
        req.location = KVLocation.HBM
        start = max(when, req.ready_s)  # not before its swap-out copy has landed in CPU
        req.ready_s = rep.link.transfer("h2d", blocks * rep.kv_block_bytes, start)
        req.touch()
        return req.ready_s
