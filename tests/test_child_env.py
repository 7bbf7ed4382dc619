"""Child processes of the tests keep the caller's PYTHONPATH (where a GPU machine's wheels are)
behind this checkout."""

from __future__ import annotations

import os

from tests.child_env import ROOT, child_env, python_path


def test_the_callers_path_is_kept_after_this_checkout(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/opt/more"]))
    env = child_env(OMP_NUM_THREADS="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/opt/site", "/opt/more"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert python_path("/hooks").split(os.pathsep)[:2] == ["/hooks", str(ROOT)]
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == str(ROOT)
