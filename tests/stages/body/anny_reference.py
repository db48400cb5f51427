"""anny's own `Anny()` (test extra), the reference the numpy body model is checked against:
its built data cached under the ignored asset cache (~3.5 min to build the first time, ~5 s
to load after). `make setup-test` builds it (`python -m tests.stages.body.anny_reference`),
so no test waits for the build."""

from __future__ import annotations

import os
from typing import Any

from pipeline.assets import cache_dir


def load() -> Any:
    """anny's Anny() (rig "anny", local-ref poses) with dense linear blend skinning."""
    os.environ["ANNY_CACHE_DIR"] = str(cache_dir() / "anny-reference")
    import anny
    import anny.paths

    anny.paths.set_anny_cache_path(os.environ["ANNY_CACHE_DIR"])
    return anny.Anny(skinning_method="lbs")


if __name__ == "__main__":
    load()
