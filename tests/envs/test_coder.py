"""The sandboxed coder runs untrusted code in another, limited process; environments follow reset/step."""

from __future__ import annotations

import pytest

from forge_nb.actors.coder import PythonTaskEnv, SandboxedPythonCoder
from forge_nb.system.runtime import registry

pytestmark = pytest.mark.timeout(120)


async def test_coder_service_runs_code_elsewhere_with_limits(runtime):
    coder = await SandboxedPythonCoder.options(num_replicas=2).as_service(timeout_s=2.0, memory_mb=256)
    try:
        ok = await coder.execute.route("import os, sys; print(6 * 7); print('oops', file=sys.stderr)")
        assert (ok.stdout, ok.stderr.strip(), ok.exit_code, ok.timed_out) == ("42\n", "oops", 0, False)
        pid = await coder.execute.route("import os; print(os.getpid(), os.getppid())")
        child, parent = map(int, pid.stdout.split())
        assert (child, parent) == (2, 1)  # its own pid namespace: pid 1 is the sandbox's init

        hang = await coder.execute.route("while True: pass", timeout_s=1.0)
        assert hang.timed_out and hang.exit_code != 0
        hog = await coder.execute.route("x = bytearray(1024 * 1024 * 1024)")
        assert hog.exit_code != 0 and "MemoryError" in hog.stderr
        secret = await coder.execute.route("import os; print(sorted(os.environ))")
        assert "HF_HUB_OFFLINE" not in secret.stdout  # the kernel's environment does not leak in
        crash = await coder.execute.route("raise SystemExit(3)")
        assert crash.exit_code == 3
        assert all(r.state == "healthy" for r in coder.replicas)  # nothing the code did hurt a replica
    finally:
        await coder.shutdown()


async def test_environment_contract_reset_then_step(runtime):
    env = await PythonTaskEnv.as_actor(timeout_s=2.0)
    try:
        obs = await env.reset.call_one(seed=3)
        assert "squared" in obs["prompt"]
        right = await env.step.call_one(f"print({obs['target']})")
        wrong = await env.step.call_one("print('no')")
        assert (right.reward, right.done, wrong.reward) == (1.0, True, 0.0)
    finally:
        await env.shutdown()


async def test_bad_limits_are_clear_errors_and_nothing_is_left(runtime):
    with pytest.raises(RuntimeError, match="timeout_s=0: must be > 0"):
        await SandboxedPythonCoder.as_service(timeout_s=0)
    assert registry.meshes() == []
