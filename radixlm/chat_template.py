"""Chat templates: messages → prompt text.

The template is, in order of preference:
1. `--chat-template NAME`: a built-in template (`chatml`, `hermes` (chatml with
   tools, Qwen2.5's form), `llama-3`, `llama-2`, `mistral`), which also brings the
   stop strings its format needs;
2. `--chat-template PATH`: a Jinja file (`.jinja`), used as is;
3. the tokenizer's own Jinja template (for a GGUF model, the one in its
   metadata, saved next to the converted weights);
4. chatml, with a warning, for a tokenizer that has none.

Rendering goes through the tokenizer's `apply_chat_template`, so templates see
what Hugging Face templates expect (`messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `raise_exception`, and any
`chat_template_kwargs`). A template that rejects the conversation (Jinja's
`raise_exception`, alternating-role checks) raises ValueError: a 400.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# Llama-2 chat and Mistral-instruct: system text folds into the first user turn.
_LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% set messages = messages[1:] %}"
    "{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] | trim"
    " + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

_MISTRAL = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\\n\\n' %}{% set messages = messages[1:] %}"
    "{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)


# chatml with tools in Qwen2.5 / Hermes form: the tools listed in the system turn, calls
# as <tool_call>{"name", "arguments"}</tool_call>, results in <tool_response> user turns.
_HERMES = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' or (message['role'] == 'assistant' and not "
    "message.tool_calls) %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message['role'] == 'assistant' %}<|im_start|>assistant"
    "{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}"
    "{% for call in message.tool_calls %}{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user"
    "{% endif %}{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n"
    "{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the stop strings its format ends a turn with."""

    name: str
    source: str | None  # None: the tokenizer's own template
    stop: tuple[str, ...] = field(default_factory=tuple)


BUILTIN_TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": ChatTemplate("chatml", _CHATML, ("<|im_end|>",)),
    "hermes": ChatTemplate("hermes", _HERMES, ("<|im_end|>",)),
    "llama-3": ChatTemplate("llama-3", _LLAMA3, ("<|eot_id|>",)),
    "llama-2": ChatTemplate("llama-2", _LLAMA2, ("</s>",)),
    "mistral": ChatTemplate("mistral", _MISTRAL, ("</s>",)),
}


def load_chat_template(name_or_path: str | None) -> ChatTemplate | None:
    """The template `--chat-template` names (None: the tokenizer's own, decided later).

    Raises ValueError for a name that is neither a built-in nor a readable file.
    """
    if name_or_path is None:
        return None
    if os.path.isfile(name_or_path):
        with open(name_or_path, encoding="utf-8") as f:
            return ChatTemplate(os.path.basename(name_or_path), f.read())
    if name_or_path in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name_or_path]
    raise ValueError(
        f"--chat-template {name_or_path!r} is neither a file nor a built-in template "
        f"({', '.join(sorted(BUILTIN_TEMPLATES))})"
    )


def resolve_chat_template(chosen: ChatTemplate | None, tokenizer: Any) -> ChatTemplate:
    """The template to render with: `chosen`, else the tokenizer's, else chatml."""
    if chosen is not None:
        return chosen
    if getattr(tokenizer, "chat_template", None):
        return ChatTemplate("tokenizer", None)
    logger.warning("The tokenizer has no chat template; using chatml")
    return BUILTIN_TEMPLATES["chatml"]


def render_chat(
    template: ChatTemplate,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for `messages`; raise ValueError when the template rejects them."""
    kwargs = dict(template_kwargs or {})
    reserved = {"conversation", "messages", "tokenize", "chat_template", "tools"}
    clash = reserved.intersection(kwargs)
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(clash))}")
    try:
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=template.source,
            tools=tools,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tokenize=False,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - Jinja errors of every kind are the input's fault
        raise ValueError(f"The chat template could not render these messages: {e}") from e
    if not isinstance(text, str):
        raise ValueError("The chat template did not produce text")
    return text


def template_stop_ids(template: ChatTemplate, tokenizer: Any) -> tuple[list[int], list[str]]:
    """The template's stop markers split into token ids (markers that are one special
    token, which the detokenizer would skip) and plain stop strings."""
    ids, strings = [], []
    for s in template.stop:
        tid = tokenizer.convert_tokens_to_ids(s)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.append(tid)
        else:
            strings.append(s)
    return ids, strings
