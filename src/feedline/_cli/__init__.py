"""The ``feedline`` command line: one entry point, one module per subcommand in :mod:`feedline._cli.commands`."""
