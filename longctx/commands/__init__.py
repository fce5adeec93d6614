"""One module per CLI command: `add_parser(parser)` and `run(args) -> exit code`."""
