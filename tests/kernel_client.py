"""A real IPython kernel driven through jupyter_client, as JupyterLab drives it."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Reply:
    status: str
    stdout: str = ""
    stderr: str = ""
    error: str = ""  # "ename: evalue"
    traceback: str = ""  # the error output as the notebook shows it (IPython's traceback, colours removed)
    results: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.stdout + "".join(self.results)

    @property
    def streams(self) -> str:
        """What the cell wrote to stdout and stderr."""
        return self.stdout + self.stderr


class Kernel:
    """Start a kernel on this interpreter (the project's venv), run cells, interrupt, restart, kill."""

    def __init__(self, cwd: str | None = None, env: dict[str, str] | None = None):
        self._specdir = tempfile.mkdtemp(prefix="forge-nb-kspec-")
        os.makedirs(f"{self._specdir}/forge-nb-test")
        with open(f"{self._specdir}/forge-nb-test/kernel.json", "w") as f:
            json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                       "display_name": "forge-nb test", "language": "python"}, f)
        self.km = KernelManager(
            kernel_name="forge-nb-test", kernel_spec_manager=KernelSpecManager(kernel_dirs=[self._specdir])
        )
        self.km.start_kernel(cwd=cwd or os.getcwd(), env={**os.environ, **(env or {})})
        self._connect()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def submit(self, code: str) -> str:
        """Send a cell without waiting; returns its msg_id for :meth:`collect`."""
        return self.kc.execute(code, store_history=False)

    def collect(self, msg_id: str, timeout: float = 120) -> Reply:
        reply = Reply(status="")
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"cell did not finish in {timeout}s; so far: {reply}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
            elif kind in ("execute_result", "display_data"):
                reply.results.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                reply.error = f"{content['ename']}: {content['evalue']}"
                reply.traceback = _ANSI.sub("", "\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        shell = self.kc.get_shell_msg(timeout=10)
        while shell["parent_header"].get("msg_id") != msg_id:
            shell = self.kc.get_shell_msg(timeout=10)
        reply.status = shell["content"]["status"]
        return reply

    def run(self, code: str, timeout: float = 120) -> Reply:
        return self.collect(self.submit(code), timeout)

    def wait_busy(self, msg_id: str, timeout: float = 10) -> None:
        """Block until the kernel reports it is running ``msg_id`` (peeks at iopub, keeps nothing)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "busy"):
                return
        raise TimeoutError("the kernel never started the cell")

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def restart(self, now: bool = False) -> None:
        self.kc.stop_channels()
        self.km.restart_kernel(now=now)
        self._connect()

    def is_alive(self) -> bool:
        return self.km.is_alive()

    def shutdown_runs_and_close(self) -> None:
        """As a notebook's last cell and File > Shut Down: ``%forge_shutdown`` while the kernel lives, then stop it."""
        try:
            if self.is_alive():
                self.run("%forge_shutdown", timeout=120)
        finally:
            self.shutdown(now=True)

    def shutdown(self, now: bool = False) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=now)
            shutil.rmtree(self._specdir, ignore_errors=True)
