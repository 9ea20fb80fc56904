"""The reasoning parser a family gets from its chat template, and its start-up resolution."""

from __future__ import annotations

import json
from pathlib import Path

from radixlm.entrypoints.family_defaults import model_template_and_archs, with_family_defaults
from radixlm.reasoning.defaults import default_reasoning_parser
from radixlm.server_args import ServerArgs

# Shortened from the real templates: where <think> appears is what matters.
QWEN3_HYBRID = ("{%- for message in messages %}{%- if '</think>' in content %}{%- endif %}"
                "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                "{%- if enable_thinking is defined and enable_thinking is false %}"
                "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
QWEN3_THINKING = ("{%- for message in messages %}{{ message.content }}{%- endfor %}"
                  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}"
                  "{%- endif %}")
LLAMA3 = "{% for m in messages %}{{ m.content }}<|eot_id|>{% endfor %}"


def test_template_decides() -> None:
    assert default_reasoning_parser(QWEN3_HYBRID, ["Qwen3ForCausalLM"]).name == "qwen3"
    assert default_reasoning_parser(QWEN3_THINKING, ["Qwen3MoeForCausalLM"]).name == \
        "qwen3-thinking"
    assert default_reasoning_parser(QWEN3_THINKING, ["Qwen2ForCausalLM"]).name == "deepseek-r1"
    assert default_reasoning_parser(LLAMA3, ["LlamaForCausalLM"]).name is None
    assert default_reasoning_parser(None).name is None


def test_start_up_resolution(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_HYBRID}))
    assert model_template_and_archs(str(tmp_path)) == (QWEN3_HYBRID, ["Qwen3ForCausalLM"])
    args = with_family_defaults(ServerArgs(model_path=str(tmp_path)))
    assert args.reasoning_parser == "qwen3"
    chosen = ServerArgs(model_path=str(tmp_path), reasoning_parser="deepseek-r1")
    assert with_family_defaults(chosen).reasoning_parser == "deepseek-r1"
    (tmp_path / "chat_template.jinja").write_text(LLAMA3)  # transformers 5 saves it here
    assert with_family_defaults(ServerArgs(model_path=str(tmp_path))).reasoning_parser is None
