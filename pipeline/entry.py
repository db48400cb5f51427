"""The `npucam` executable (and `python -m pipeline`): the process settings a long-running
stream needs, then the command line (pipeline.cli.main).

They live here, not in pipeline.cli, because they are process-wide: tests call
pipeline.cli.main inside their own interpreter and keep its defaults, while every `npucam`
process, and bench/soak.py, which runs the pipeline as `npucam run` does, gets them.
"""

from __future__ import annotations

from pipeline.memory import cap_malloc_arenas, fix_malloc_thresholds, start_trimming


def configure_process() -> None:
    """Settings every npucam process applies before any other thread starts: glibc's malloc
    arenas capped and frame-sized blocks kept in them until their free pages are handed back
    every 10 s (pipeline/memory.py; the environment's MALLOC_* settings win)."""
    cap_malloc_arenas()
    fix_malloc_thresholds()
    start_trimming()


def main() -> int:
    configure_process()
    from pipeline.cli import main as cli_main

    return cli_main()
