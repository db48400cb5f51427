"""Which `<topic>/<name>` topics some subscriber wants, from the subscribe / unsubscribe
notifications of publish's XPUB socket (stages/publish.py): the preview (stages/preview.py)
and mesh (stages/body/mesh.py) topics are only made while someone asks for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class TopicInterest:
    """Subscriptions that match `<topic><name>` for the given names (topic ends in "/").

    Only prefixes that can match such a topic are kept (a prefix of `topic`, or `topic` + a
    prefix of a name), so what a subscriber sends costs at most one counter per prefix of a
    configured name.
    """

    def __init__(self, topic: str, names: Sequence[str]) -> None:
        self.topic = topic
        self.names = tuple(names)
        self._all = 0  # subscriptions that match every such topic ("", "p", ..., topic)
        self._prefixes: Counter[str] = Counter()

    def subscription(self, subscribe: bool, prefix: bytes) -> bool:
        """One XPUB notification: subscribe (True) or unsubscribe of a topic prefix. True
        when it concerns one of these topics."""
        try:
            topic = prefix.decode()
        except UnicodeDecodeError:
            return False  # matches no topic of ours: they are UTF-8
        step = 1 if subscribe else -1
        if self.topic.startswith(topic):
            self._all = max(0, self._all + step)
            return True
        if topic.startswith(self.topic):
            name = topic[len(self.topic) :]
            if any(n.startswith(name) for n in self.names):
                self._prefixes[name] += step
                if self._prefixes[name] <= 0:
                    del self._prefixes[name]
                return True
        return False

    @property
    def viewers(self) -> int:
        """Subscriptions that match some of these topics."""
        return self._all + sum(self._prefixes.values())

    def wanted(self, name: str) -> bool:
        """Whether some subscriber's prefix matches `<topic><name>`."""
        return self._all > 0 or any(name.startswith(p) for p in self._prefixes)
