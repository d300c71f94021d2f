"""One module per ``feedline`` subcommand (see :mod:`feedline._cli.__main__` for the protocol)."""
