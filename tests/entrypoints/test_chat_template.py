"""Chat templates: built-ins, files, the tokenizer's own, continue_final_message, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _fake_runtime import byte_tokenizer

from radixlm.chat_template import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    load_chat_template,
    render_chat,
    resolve_chat_template,
    template_stop_ids,
)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]


@pytest.fixture(scope="module")
def tok() -> Any:
    return byte_tokenizer()


@pytest.mark.parametrize("name,expected", [
    ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
               "<|im_start|>assistant\n"),
    ("llama-3", "<|im_start|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("llama-2", "<|im_start|>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello <|im_end|>"
                "<|im_start|>[INST] Bye [/INST]"),
    ("mistral", "<|im_start|>[INST] Be brief.\n\nHi [/INST]Hello<|im_end|>[INST] Bye [/INST]"),
])
def test_builtin_templates(tok: Any, name: str, expected: str) -> None:
    template = load_chat_template(name)
    assert template is not None
    assert render_chat(template, tok, CHAT) == expected


def test_alternation_is_enforced(tok: Any) -> None:
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError, match="alternate"):
        render_chat(BUILTIN_TEMPLATES["mistral"], tok, bad)


def test_file_template_and_kwargs(tok: Any, tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}|{{ greeting }}]{{ m.content }}"
                    "{% endfor %}")
    template = load_chat_template(str(path))
    assert template is not None and template.name == "t.jinja"
    out = render_chat(template, tok, CHAT[:2], add_generation_prompt=False,
                      template_kwargs={"greeting": "yo"})
    assert out == "[system|yo]Be brief.[user|yo]Hi"
    with pytest.raises(ValueError, match="tokenize"):
        render_chat(template, tok, CHAT, template_kwargs={"tokenize": True})


def test_default_is_the_tokenizers_own(tok: Any) -> None:
    template = resolve_chat_template(None, tok)
    assert template.name == "tokenizer"
    out = render_chat(template, tok, [{"role": "user", "content": "Hi"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_continue_final_message(tok: Any) -> None:
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    out = render_chat(ChatTemplate("tokenizer", None), tok, msgs, continue_final_message=True)
    assert out.endswith("<|im_start|>assistant\nHel")


def test_unknown_template_and_stop_ids(tok: Any) -> None:
    with pytest.raises(ValueError, match="neither a file nor a built-in"):
        load_chat_template("no-such-template")
    ids, strings = template_stop_ids(BUILTIN_TEMPLATES["chatml"], tok)
    assert ids == [tok.convert_tokens_to_ids("<|im_end|>")] and strings == []
    ids, strings = template_stop_ids(BUILTIN_TEMPLATES["llama-3"], tok)
    assert ids == [] and strings == ["<|eot_id|>"]
