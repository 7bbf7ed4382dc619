from __future__ import annotations

import asyncio
import inspect
import os

import pytest

# The built-in model is written here on first use; keep test runs away from the user's cache.
os.environ.setdefault("CADENCE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache"))


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


# A hang is a failure with a stack, never a stalled run (pytest-timeout): unit tests get this
# long, everything else the default in pyproject.toml.
UNIT_TEST_TIMEOUT_S = 120
_UNIT_DIRS = ("scheduler", "worker", "model", "runtime", "numba_kernels", "graphs")


def _is_unit_test(item: pytest.Item) -> bool:
    parts = item.path.relative_to(os.path.dirname(__file__)).parts
    return len(parts) == 1 or parts[0] in _UNIT_DIRS


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None and _is_unit_test(item):
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_S))
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Without pytest-asyncio (the GPU machines have none) an ``async def`` test runs here in a
    fresh event loop, as the plugin's auto mode runs it (its fixtures are plain functions)."""
    if (not inspect.iscoroutinefunction(pyfuncitem.obj)
            or pyfuncitem.config.pluginmanager.has_plugin("asyncio")):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture(autouse=True, scope="session")
def single_thread_torch():
    """The tests multiply tiny matrices: one intra-op thread is faster, and immune to the
    spin-wait slowdowns of a busy 2-core machine (engine threads of servers that outlive a test
    would otherwise spin against the event loop)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

