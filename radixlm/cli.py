"""Command line: `radixlm serve` (the HTTP server) and `radixlm generate "prompt"`."""

from __future__ import annotations

import argparse
import json
import sys

from radixlm.server_args import add_cli_args, from_cli_args


def _generate(ns: argparse.Namespace) -> int:
    from radixlm.entrypoints.engine import Engine

    args = from_cli_args(ns)
    params = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
    prompt = ns.prompt
    with Engine(args) as engine:
        if ns.chat:
            prompt = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        if ns.json:
            print(json.dumps(engine.generate(prompt, params), indent=2))
            return 0
        for chunk in engine.generate(prompt, params, stream=True):
            print(chunk["delta"], end="", flush=True)
        print()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Serve the model over HTTP (native and OpenAI APIs).",
                           description="Serve the model over HTTP: native /generate and the "
                           "OpenAI-compatible /v1 API.")
    add_cli_args(serve)

    gen = sub.add_parser("generate", help="Generate text for one prompt and print it.")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--raw", dest="chat", action="store_false",
                     help="Send the prompt as is instead of through the chat template.")
    gen.add_argument("--json", action="store_true", help="Print the full result as JSON.")
    add_cli_args(gen)

    ns = parser.parse_args(argv)
    if ns.command == "serve":
        from radixlm.launch_server import serve as run_serve

        return run_serve(ns)
    if ns.command == "generate":
        return _generate(ns)
    return 2


if __name__ == "__main__":
    sys.exit(main())
