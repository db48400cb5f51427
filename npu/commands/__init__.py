"""The `npucam` subcommands of the device side: bundle and device (each module's
`register(subparsers)`, listed as npucam.commands entry points in pyproject.toml)."""
