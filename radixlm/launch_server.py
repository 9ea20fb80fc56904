"""`python -m radixlm.launch_server [flags]`: start the HTTP server (same as `radixlm serve`)."""

from __future__ import annotations

import argparse
import sys

from radixlm.server_args import add_cli_args, from_cli_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radixlm.launch_server",
        description="Serve a model over HTTP: native /generate and the OpenAI API.",
    )
    add_cli_args(parser)
    return serve(parser.parse_args(argv))


def serve(ns: argparse.Namespace) -> int:
    from radixlm.entrypoints.http.server import run_server

    try:
        args = from_cli_args(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from radixlm.entrypoints.family_defaults import with_family_defaults

    args = with_family_defaults(args)  # before any process: they all read the same args
    if args.node_rank > 0:  # a node that runs TP ranks only (see docs/scaling-out.md)
        from radixlm.entrypoints.launch import run_worker_node

        return run_worker_node(args)
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
