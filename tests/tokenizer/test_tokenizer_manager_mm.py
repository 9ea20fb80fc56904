"""The real TokenizerManager's multimodal path, with no child processes: a PULL socket
stands in for the scheduler and receives what the manager sends."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import zmq

from radixlm.messages.io_struct import AbortReq, TokenizedGenerateReq
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.request_input import GenerateReqInput
from radixlm.tokenizer.tokenizer_manager import TokenizerManager
from radixlm.utils import PortArgs

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multimodal"))
from _tiny_llava import NUM_LLAVA_TOKENS, build_processor_dir, data_url, png_bytes  # noqa: E402


async def _first_message(args: ServerArgs, model_dir: str, obj: GenerateReqInput,
                         model_info: dict[str, Any]) -> Any:
    """What the manager sends the scheduler for `obj` (or the error generate raises)."""
    ports = PortArgs.create()
    ctx = zmq.Context(1)
    scheduler = ctx.socket(zmq.PULL)
    scheduler.bind(ports.scheduler_input)
    tm = TokenizerManager(args, model_dir, ports)
    tm.model_info = model_info
    task = asyncio.ensure_future(tm.generate(obj).__anext__())
    try:
        while not task.done() and not scheduler.poll(10):
            await asyncio.sleep(0.01)
        if task.done():
            return task.exception()
        msg = scheduler.recv_pyobj()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert isinstance(scheduler.recv_pyobj(), AbortReq)  # the cancelled request aborts
        return msg
    finally:
        tm.close()
        scheduler.close(linger=0)
        ctx.term()
        shutil.rmtree(ports.folder, ignore_errors=True)


def test_images_reach_the_scheduler_expanded(tmp_path: Path) -> None:
    model_dir = str(build_processor_dir(tmp_path / "llava"))
    red = data_url(png_bytes())
    obj = GenerateReqInput(text="<image> and <image>?", image_data=[red, red],
                           sampling_params={"max_new_tokens": 2})
    msg = asyncio.run(_first_message(ServerArgs(model_path=model_dir), model_dir, obj,
                                     {"vocab_size": 300, "context_length": 512}))
    assert isinstance(msg, TokenizedGenerateReq), msg
    mm = msg.mm_inputs
    assert mm is not None and [it.num_tokens for it in mm.items] == [NUM_LLAVA_TOKENS] * 2
    assert mm.items[0].pad_value == mm.items[1].pad_value >= 300
    assert msg.input_ids.count(mm.items[0].pad_value) == 2 * NUM_LLAVA_TOKENS
    assert len(msg.input_ids) == 2 * NUM_LLAVA_TOKENS + len(" and ?")


def test_default_text_model_rejects_images_and_serves_text() -> None:
    from radixlm.model_loader.model_path import resolve_model_dir

    obj = GenerateReqInput(text="hi", image_data=data_url(png_bytes()))
    err = asyncio.run(_first_message(ServerArgs(), resolve_model_dir(None), obj,
                                     {"vocab_size": 49152, "context_length": 2048}))
    assert isinstance(err, ValueError)
    assert "The model SmolLM2-135M-Instruct has no vision support" in str(err)
    text = GenerateReqInput(text="hi", sampling_params={"max_new_tokens": 2})
    msg = asyncio.run(_first_message(ServerArgs(), resolve_model_dir(None), text,
                                     {"vocab_size": 49152, "context_length": 2048}))
    assert isinstance(msg, TokenizedGenerateReq) and msg.mm_inputs is None

