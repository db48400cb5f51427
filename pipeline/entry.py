"""The `npucam` executable (and `python -m pipeline`): the process settings a long-running
stream needs, then the command line (pipeline.cli.main).

They live here, not in pipeline.cli, because they are process-wide: tests call
pipeline.cli.main inside their own interpreter and keep its defaults, while every `npucam`
process, and bench/soak.py, which runs the pipeline as `npucam run` does, gets them.
"""

from __future__ import annotations

from pipeline.memory import cap_malloc_arenas


def configure_process() -> None:
    """Settings every npucam process applies before any thread starts: glibc's malloc arenas
    capped (pipeline/memory.py; MALLOC_ARENA_MAX in the environment wins)."""
    cap_malloc_arenas()


def main() -> int:
    configure_process()
    from pipeline.cli import main as cli_main

    return cli_main()
