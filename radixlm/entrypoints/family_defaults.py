"""Per-family defaults decided once at start-up, before any process starts.

The reasoning parser, when `--reasoning-parser` is not given, comes from the
model's chat template (reasoning/defaults.py): every process that splits or
constrains output (the scheduler's grammars, the tokenizer manager, the
OpenAI layer) then reads the same `ServerArgs.reasoning_parser`. The tool-call
parser is chosen by the OpenAI layer from the same template
(function_call/detect.py); both choices are logged.

The template and architectures are read cheaply: config.json and
tokenizer_config.json (or chat_template.jinja) of a folder, the metadata of a
GGUF file. A model that cannot be read here is left to fail where it loads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from radixlm.reasoning.defaults import default_reasoning_parser
from radixlm.server_args import ServerArgs

logger = logging.getLogger(__name__)


def model_template_and_archs(model_path: str | None) -> tuple[str | None, list[str]]:
    """(the model's own chat template, config.json's architectures) without loading it."""
    from radixlm.default_model import default_model_path

    path = model_path or default_model_path()
    if os.path.isfile(path) and path.endswith(".gguf"):
        from radixlm.model_loader.gguf_arch import ARCHS
        from radixlm.model_loader.gguf_file import read_gguf

        meta = read_gguf(path).metadata
        arch = ARCHS.get(str(meta.get("general.architecture")), ("", ""))[1]
        template = meta.get("tokenizer.chat_template")
        return (template if isinstance(template, str) else None), [arch] if arch else []
    config = _read_json(os.path.join(path, "config.json"))
    archs = list(config.get("architectures") or [])
    template = _read_text(os.path.join(path, "chat_template.jinja"))
    if template is None:
        value = _read_json(os.path.join(path, "tokenizer_config.json")).get("chat_template")
        if isinstance(value, list):  # named templates: the default one
            value = next((t.get("template") for t in value if t.get("name") == "default"), None)
        template = value if isinstance(value, str) else None
    return template, archs


def with_family_defaults(args: ServerArgs) -> ServerArgs:
    """`args` with the reasoning parser the model's family calls for (logged)."""
    if args.reasoning_parser is not None:
        logger.info("Reasoning parser: %s (--reasoning-parser)", args.reasoning_parser)
        return args
    try:
        template, archs = model_template_and_archs(args.model_path)
    except (OSError, ValueError) as e:
        logger.debug("no family defaults for %s: %s", args.model_path, e)
        return args
    if args.chat_template and args.chat_template.endswith(".jinja"):
        template = _read_text(args.chat_template) or template
    choice = default_reasoning_parser(template, archs)
    logger.info("Reasoning parser: %s (%s)", choice.name or "none", choice.reason)
    if choice.name is None:
        return args
    return dataclasses.replace(args, reasoning_parser=choice.name)


def _read_json(path: str) -> dict:  # type: ignore[type-arg]
    text = _read_text(path)
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
