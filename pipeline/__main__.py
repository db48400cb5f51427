"""`python -m pipeline` is the npucam executable (pipeline/entry.py)."""

from pipeline.entry import main

raise SystemExit(main())
