"""Members: the one worker-group core. Which actor holds each place of a group, how a place gets a
new actor, whether the actors are alive, and how many restarts the group has left.

Both worker groups keep their workers here: `runtime.workers.worker_group.RayWorkerGroup` (hosts
that run the user's class, `runtime.workers.worker_host`) and the NeMo RL face's `RayWorkerGroup`
(the user's own actors, started by `RayWorkerBuilder`'s initializers). What differs between them is
only what a place's actor is, so each group gives its `start(index, again)`: the handle of a new actor
for place `index` (or an ObjectRef of one), `again` when it replaces one that was there. The rest is
here, once:
    start_all()        a new actor in every place, started together
    dead(timeout_s)    the places whose actors are gone (failures.dead_among: Ray says so, or silent
                       on a dead node; a busy one is not dead)
    spend_restart()    the restart policy, once for both groups: one restart of the group's max_restarts,
                       or WorkerFailureError saying the group restarts nothing (restart_on_failure off)
                       or has used them
    replace(places)    the actors there killed (no Ray restart) and started again through `start`
    kill_all()         every actor killed; the group holds none
and GroupOfMembers, the groups' base, shows `workers` (the handles) and `restarts` from it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import ray

from runtime.workers.failures import WorkerFailureError, dead_among

Start = Callable[[int, bool], Any]  # (place, again) -> an actor handle, or an ObjectRef of one


def _resolved(started: list) -> list:
    """The handles, with every ObjectRef among them fetched in one ray.get."""
    refs = [i for i, h in enumerate(started) if isinstance(h, ray.ObjectRef)]
    if refs:
        for i, handle in zip(refs, ray.get([started[i] for i in refs])):
            started[i] = handle
    return started


class Members:
    """The actors of one worker group, one per place (a rank, or a NeMo RL worker index)."""

    def __init__(self, start: Start, nodes: Callable[[], list[Optional[str]]], *, restart_on_failure: bool,
                 max_restarts: int = 0):
        self._start = start
        self._nodes = nodes  # the Ray node ID each place's slot is on (asked once per liveness check)
        self.restart_on_failure = restart_on_failure
        self.max_restarts = max_restarts
        self.restarts = 0
        self.handles: list = []

    def __len__(self) -> int:
        return len(self.handles)

    def start_all(self, count: int) -> list:
        """A new actor in each of places 0..count-1, all submitted before any is waited for."""
        self.handles = _resolved([self._start(place, False) for place in range(count)])
        return self.handles

    def dead(self, timeout_s: float) -> list[int]:
        """The places whose actors are gone, as failures.dead_among decides it (the slots' nodes asked at
        most once, and only when an actor is silent)."""
        nodes = functools.cache(self._nodes)
        return dead_among(self.handles, lambda place: nodes()[place], timeout_s) if self.handles else []

    def can_restart(self) -> bool:
        return self.restart_on_failure and self.restarts < self.max_restarts

    def spend_restart(self, dead: list[int]) -> int:
        """One restart for the places in DEAD (none: nothing spent); the restarts made so far. A
        WorkerFailureError when the group restarts nothing (asked even with DEAD empty: the caller learns
        the policy before any worker dies) or has used its max_restarts."""
        rank = dead[0] if dead else None
        if not self.restart_on_failure:
            raise WorkerFailureError("this group was made without restart_on_failure=True; its dead workers stay dead"
                                     + (f" (worker(s) {dead})" if dead else ""), rank=rank)
        if not dead:
            return self.restarts
        if self.restarts >= self.max_restarts:
            raise WorkerFailureError(f"worker(s) {dead} are gone and the group has used its {self.max_restarts} "
                                     f"restart(s) (max_restarts)", rank=rank)
        self.restarts += 1
        return self.restarts

    def replace(self, places: list[int], wait_ready: bool = False) -> list:
        """Kill the actors in PLACES (they are not restarted by Ray) and start each place again through
        `start(place, again=True)`; with wait_ready, return once every new actor's __init__ has run."""
        for place in places:
            try:
                ray.kill(self.handles[place], no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        started = _resolved([self._start(place, True) for place in places])
        for place, handle in zip(places, started):
            self.handles[place] = handle
        if wait_ready and started:
            ray.get([h.__ray_ready__.remote() for h in started])
        return started

    def kill_all(self) -> bool:
        """Kill every actor; the group then holds none. False if a kill failed."""
        ok = True
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception as e:  # noqa: BLE001 - reported, the others are still killed
                ok = False
                print(f"Error killing worker: {e}", flush=True)
        self.handles = []
        return ok


class GroupOfMembers:
    """The base of both worker groups: what they show of the workers they keep in `self.members`."""
    members: Members

    @property
    def workers(self) -> list:
        """The workers' actor handles, by place (rank r's is workers[r])."""
        return self.members.handles

    @property
    def restarts(self) -> int:
        """Restarts made so far (of max_restarts)."""
        return self.members.restarts
