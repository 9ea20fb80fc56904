"""The default GGUF model: found, its config and tokenizer cached in a folder that links to
the file (no weights written), and equal to transformers' own GGUF loading (logits,
tokenizer, chat template) when dequantized to float32.

transformers' GGUF model loading takes ~30 s here, so it runs once per module.
"""

from __future__ import annotations

import os

import pytest
import torch

from radixlm.default_model import default_model_path, display_name
from radixlm.layers.attention import create_attention_backend
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.model_loader import gguf_arch, gguf_convert
from radixlm.model_loader.loader import load_model
from radixlm.model_loader.model_path import resolve_model_dir

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return default_model_path()


@pytest.fixture(scope="module")
def converted(gguf_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return gguf_convert.convert_gguf(gguf_path, str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def hf_model(gguf_path: str):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def _prefill_logits(model: torch.nn.Module, config, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Our model on one prompt through a real KV pool: [len(ids), vocab]."""
    kv = TokenToKVPool(
        64,
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.head_dim,
        torch.float32,
        "cpu",
    )
    rows = ReqToTokenPool(1, 64, "cpu")
    row = rows.alloc()
    slots = kv.alloc(len(ids))
    assert row is not None and slots is not None
    rows.req_to_token[row, : len(ids)] = slots
    backend = create_attention_backend("torch_native", model)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.arange(len(ids)),
        out_cache_loc=slots,
        req_pool_indices=torch.tensor([row]),
        req_to_token=rows.req_to_token,
        token_to_kv_pool=kv,
        prefix_lens=[0],
        extend_lens=[len(ids)],
        attn_backend=backend,
    )
    backend.init_forward_metadata(batch)
    with torch.no_grad():
        return model.compute_logits(model(batch.input_ids, batch.positions, batch))  # type: ignore[operator]


def test_default_model_is_found(gguf_path: str) -> None:
    assert os.path.basename(gguf_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(gguf_path)
    assert display_name(None) == "SmolLM2-135M-Instruct"
    assert display_name(gguf_path) == "SmolLM2-135M-Instruct"
    assert display_name("/m/Qwen2-0.5B-Instruct-Q4_K_M.gguf") == "Qwen2-0.5B-Instruct"
    assert display_name("/models/Llama-3.2-1B/") == "Llama-3.2-1B"


def test_resolve_model_dir(converted: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert resolve_model_dir(converted) == converted
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve_model_dir(str(tmp_path / "missing"))


def test_converted_folder(converted: str, gguf_path: str, hf_model) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoConfig

    names = set(os.listdir(converted))
    assert {"config.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith((".safetensors", ".bin")) for n in names)  # weights stay in the file
    assert os.path.realpath(os.path.join(converted, "model.gguf")) == os.path.realpath(gguf_path)
    assert not any(n.startswith(".tmp") for n in os.listdir(os.path.dirname(converted)))
    ours = AutoConfig.from_pretrained(converted)
    ref = hf_model.config
    assert ours.architectures == ["LlamaForCausalLM"]
    assert ours.tie_word_embeddings is True
    assert ours.dtype == torch.float32
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "bos_token_id",
        "eos_token_id",
    ):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.rope_parameters["rope_theta"] == ref.rope_parameters["rope_theta"]
    # A second call reuses the folder.
    assert gguf_convert.convert_gguf(gguf_path, os.path.dirname(converted)) == converted


def test_logits_match_transformers(converted: str, hf_model) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(converted)(PROMPT).input_ids
    model, config = load_model(converted, torch.float32, "cpu")
    ours = _prefill_logits(model, config, ids)  # [T, V]
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= 1e-3 * scale


def test_tokenizer_and_chat_template(converted: str, gguf_path: str) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    ours = AutoTokenizer.from_pretrained(converted)
    folder, name = os.path.split(gguf_path)
    ref = PreTrainedTokenizerFast(gguf_file=name, name_or_path=folder)  # transformers' GGUF path
    for text in (PROMPT, "Hello world!  Ünïcode ☃ 你好\n\tx = 12345678;", "<|endoftext|>a"):
        assert ours(text).input_ids == ref(text).input_ids
    assert (ours.eos_token, ours.bos_token) == (ref.eos_token, ref.bos_token)
    assert ours.chat_template and ours.chat_template == ref.chat_template
    text = ours.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:  # convert_hf_to_gguf.py
        return (
            w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    w = torch.randn(3 * 8, 5)
    torch.testing.assert_close(gguf_arch.unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    b = torch.randn(3 * 8)
    torch.testing.assert_close(gguf_arch.unpermute_qk(llama_cpp_permute(b, 3), 3), b)


def test_concurrent_conversion_keeps_the_first_complete_folder(
    gguf_path: str,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """A process that loses the race discards its copy and returns the winner's folder."""
    out_dir = gguf_convert.gguf_cache_dir(gguf_path, str(tmp_path))

    def write_while_another_process_wins(path: str, tmp_dir: str) -> None:
        os.makedirs(out_dir)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")
        with open(os.path.join(out_dir, "winner"), "w") as f:
            f.write("")
        with open(os.path.join(tmp_dir, "config.json"), "w") as f:
            f.write("{}")

    monkeypatch.setattr(gguf_convert, "_write_hf_folder", write_while_another_process_wins)
    assert gguf_convert.convert_gguf(gguf_path, str(tmp_path)) == out_dir
    assert os.path.isfile(os.path.join(out_dir, "winner"))
    assert sorted(os.listdir(os.path.dirname(out_dir))) == [os.path.basename(out_dir)]


def test_first_conversion_in_a_child_keeps_the_heavy_imports_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The HTTP process converts a GGUF file's config and tokenizer in a forked child
    (resolve_model_dir(..., convert_in_child=True)): the folder is the same, and the
    modules the conversion imports (transformers' config classes, which pull
    accelerate and sympy) stay out of the calling process."""
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from radixlm.model_loader.model_path import resolve_model_dir\n"
            "folder = resolve_model_dir(None, True)\n"
            "assert os.path.isfile(os.path.join(folder, 'config.json'))\n"
            "assert os.path.isfile(os.path.join(folder, 'tokenizer.json'))\n"
            "assert resolve_model_dir(None) == folder\n"
            "print(folder)\n"
            "print(sorted(m for m in ('accelerate', 'sympy') if m in sys.modules))\n")
    env = dict(os.environ, RADIXLM_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env, check=True)
    folder, heavy = out.stdout.strip().splitlines()[-2:]
    assert folder.startswith(str(tmp_path)) and heavy == "[]"
