"""`python -m pipeline` is the npucam CLI."""

from pipeline.cli import main

raise SystemExit(main())
