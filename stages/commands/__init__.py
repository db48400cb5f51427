"""The `npucam` subcommands of the stages and models: face, clip, pose and plan (each module's
`register(subparsers)`, listed as npucam.commands entry points in pyproject.toml)."""
