"""torch.profiler traces of the scheduler process (POST /start_profile, /stop_profile).

A profile records every scheduler step (schedule, forward, sampling) from
`start` until `num_steps` steps have run or `stop` is called, and at most
`MAX_PROFILE_STEPS` steps either way, so a forgotten profile cannot fill the
disk. The trace is written as a Chrome trace (`<profile_id>-TP-0.trace.json.gz`),
which `torch.profiler`'s tools, Perfetto and chrome://tracing open, in the
request's `output_dir` or `--profile-dir`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from radixlm.messages.io_struct import ProfileOut, ProfileReq

logger = logging.getLogger(__name__)

MAX_PROFILE_STEPS = 1000
ACTIVITIES = ("CPU", "GPU")


class Profiler:
    def __init__(self, default_dir: str, device: str) -> None:
        self.default_dir = default_dir
        self.device = device
        self._prof: Any = None
        self._path: str | None = None
        self._num_steps = 0
        self._max_steps = MAX_PROFILE_STEPS
        self.last_trace: str | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def handle(self, req: ProfileReq) -> ProfileOut:
        return self.start(req) if req.action == "start" else self.stop()

    def start(self, req: ProfileReq) -> ProfileOut:
        import torch

        if self.active:
            return ProfileOut(False, "A profile is already running; POST /stop_profile first")
        if req.num_steps is not None and not 1 <= req.num_steps <= MAX_PROFILE_STEPS:
            return ProfileOut(False, f"num_steps must be between 1 and {MAX_PROFILE_STEPS}")
        activities = req.activities or ["CPU"] + (["GPU"] if self.device == "cuda" else [])
        unknown = [a for a in activities if a not in ACTIVITIES]
        if unknown:
            return ProfileOut(False, f"Unknown activities {unknown}; choose from "
                                     f"{list(ACTIVITIES)}")
        if "GPU" in activities and self.device != "cuda":
            return ProfileOut(False, "GPU activity needs a CUDA device (this server runs on "
                                     f"{self.device})")
        output_dir = req.output_dir or self.default_dir
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            return ProfileOut(False, f"Cannot create the output folder {output_dir!r}: {e}")
        kinds = {"CPU": torch.profiler.ProfilerActivity.CPU,
                 "GPU": torch.profiler.ProfilerActivity.CUDA}
        profile_id = req.profile_id or str(time.time())
        if os.sep in profile_id or profile_id.startswith("."):
            return ProfileOut(False, "profile_id must be a plain file name")
        self._path = os.path.join(output_dir, f"{profile_id}-TP-0.trace.json.gz")
        self._prof = torch.profiler.profile(activities=[kinds[a] for a in activities],
                                            record_shapes=req.record_shapes,
                                            with_stack=req.with_stack)
        self._prof.start()
        self.last_trace = None
        self._num_steps = 0
        self._max_steps = req.num_steps or MAX_PROFILE_STEPS
        logger.info("Profiling %s steps into %s",
                    req.num_steps or f"up to {MAX_PROFILE_STEPS}", self._path)
        return ProfileOut(True, "Start profiling.", self._path)

    def on_step(self) -> None:
        """After each scheduler step: stop once the profile has its steps."""
        if self._prof is None:
            return
        self._prof.step()
        self._num_steps += 1
        if self._num_steps >= self._max_steps:
            self.stop()

    def stop(self) -> ProfileOut:
        if self._prof is None:
            if self.last_trace is not None:
                return ProfileOut(True, f"The profile already stopped after its steps; "
                                        f"trace: {self.last_trace}", self.last_trace)
            return ProfileOut(False, "No profile is running; POST /start_profile first")
        prof, path = self._prof, self._path
        self._prof = None
        prof.stop()
        assert path is not None
        prof.export_chrome_trace(path)
        self.last_trace = path
        logger.info("Profile of %d steps written to %s", self._num_steps, path)
        return ProfileOut(True, f"Stopped profiling after {self._num_steps} steps; trace: "
                                f"{path}", path)
