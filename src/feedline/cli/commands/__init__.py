"""One module per ``feedline`` subcommand (see :mod:`feedline.cli.__main__` for the protocol)."""
