"""``feedline keys generate DIR``: CurveZMQ keys for the loader service."""

from __future__ import annotations

import argparse

from feedline._service.auth import generate_keys

NAME = "keys"
HELP = "create CurveZMQ keys: the server's pair and an authorized client's pair"
EXAMPLE = "feedline keys generate keys/ && feedline serve train.yaml --bind tcp://0.0.0.0:5555 --keys keys/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["generate"], help="what to do (generate)")
    parser.add_argument("directory", help="folder for the keys (created if needed)")
    parser.add_argument("--client", default="client",
                        help="name of the client key pair to add (run again with another name for more clients)")


def run(args: argparse.Namespace) -> int:
    paths = generate_keys(args.directory, args.client)
    print(f"server public key  {paths['server_public']}  (give to trainers)")
    print(f"server secret key  {paths['server_secret']}  (keep on the server)")
    print(f"client secret key  {paths['client_secret']}  (give to trainers)")
    print(f"authorized client  {paths['authorized']}")
    print(f"serve: feedline serve SPEC --keys {args.directory}; trainers: Loader(ADDRESS, keys={args.directory!r})")
    return 0
