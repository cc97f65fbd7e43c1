"""One module per subcommand; each exposes ``add_parser`` and ``run``."""
