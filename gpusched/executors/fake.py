"""An in-memory executor for core tests and the simulator: nothing runs; the test (or the
simulator's clock) decides when and how each attempt ends, and it ends exactly as the
real wrapper would end it: output.log and exit.json in the attempt directory."""

from __future__ import annotations

import json
import os

from msgspec import Struct, field

from gpusched.attempt import AttemptPaths
from gpusched.executors import Handle, LaunchRequest


class FakeExecutor(Struct):
    name: str = "fake"
    launched: list[LaunchRequest] = field(default_factory=list)
    live: dict[str, Handle] = field(default_factory=dict)  # token -> handle
    terminated: list[str] = field(default_factory=list)

    def launch(self, req: LaunchRequest) -> Handle:
        self.launched.append(req)
        handle = {"token": req.token, "dir": str(req.attempt_dir)}
        self.live[req.token] = handle
        return handle

    def alive(self, handle: Handle) -> bool:
        return handle.get("token") in self.live

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        self.terminated.append(handle["token"])
        if handle.get("token") in self.live:
            self.finish(handle["token"], exit_code=None if force else 143, signal=9 if force else 15)

    def discover(self) -> dict[str, Handle]:
        return dict(self.live)

    def release(self, handle: Handle) -> None:
        pass

    # ------------------------------------------------------------------ test controls

    def finish(
        self,
        token: str,
        *,
        exit_code: int | None,
        output: str = "",
        signal: int | None = None,
        started_at: float = 0.0,
        ended_at: float = 0.0,
        runtime: dict | None = None,
    ) -> None:
        """End an attempt as the wrapper would: append output, write exit.json (and runtime.json)."""
        handle = self.live.pop(token)
        paths = AttemptPaths(handle["dir"])
        os.makedirs(paths.dir, exist_ok=True)
        with open(paths.output, "a") as f:
            f.write(output)
        if runtime is not None:
            paths.runtime.write_text(json.dumps(runtime))
        paths.exit.write_text(
            json.dumps(
                {"exit_code": exit_code, "signal": signal, "started_at": started_at, "ended_at": ended_at}
            )
        )

    def vanish(self, token: str) -> None:
        """The process disappears without an exit record (pane killed, machine rebooted)."""
        self.live.pop(token)

    def token_of(self, job_id: str) -> str:
        """The newest launched attempt's token of ``job_id``."""
        return [r.token for r in self.launched if r.job_id == job_id][-1]
