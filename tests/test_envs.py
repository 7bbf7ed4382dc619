"""The environment switches' words for on and off, and the warning for anything else."""

from __future__ import annotations

import warnings

import pytest

from cadence.envs import read_envs

NAME = "CADENCE_DISABLE_LAUNCH_TAPES"


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), (" Yes ", True), ("ON", True),
     ("0", False), ("false", False), ("No", False), ("off", False)],
)
def test_the_words_for_on_and_off(monkeypatch, value, on):
    monkeypatch.setenv(NAME, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recognized word warns about nothing
        assert read_envs().disable_launch_tapes is on


@pytest.mark.parametrize("value", ["ture", "2", "enabled"])
def test_any_other_value_reads_as_off_and_says_so(monkeypatch, value):
    from cadence import envs

    envs._warn_unknown.cache_clear()  # warned once per process: this test must see it
    monkeypatch.setenv(NAME, value)
    with pytest.warns(UserWarning, match=f"{NAME}='{value}' is neither on"):
        assert read_envs().disable_launch_tapes is False


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("CADENCE_ASYNC_SCHEDULING", raising=False)
    assert read_envs().async_scheduling is None
    monkeypatch.setenv("CADENCE_ASYNC_SCHEDULING", "")
    assert read_envs().async_scheduling is None


def test_an_unknown_value_warns_once_however_often_it_is_read(monkeypatch):
    """Every command reads the switches in several places; the user hears of a typo once."""
    import subprocess
    import sys

    code = ("from cadence.envs import read_envs\n"
            "def a(): read_envs()\n"
            "def b(): read_envs()\n"
            "a(); b(); a()\n")
    env = dict(__import__("os").environ, CADENCE_DISABLE_DENSE_PREFILL="garbage")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("CADENCE_DISABLE_DENSE_PREFILL='garbage' is neither on") == 1


@pytest.mark.parametrize(("value", "level"), [("", 20), ("debug", 10), (" Warning ", 30),
                                              ("15", 15), ("ERROR", 40)])
def test_the_log_level_takes_names_and_numbers(monkeypatch, value, level):
    monkeypatch.setenv("CADENCE_LOG_LEVEL", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_envs().logging_level == level


def test_an_unknown_log_level_reads_as_info_and_every_command_still_runs(monkeypatch):
    """A level logging does not know warns, names the variable and reads as INFO: it used to
    end every command, --version included, in a traceback."""
    import subprocess
    import sys

    from cadence import envs

    envs._logging_level.cache_clear()  # it warns once per process
    for value in ("bogus", "²"):  # "²" is a digit to str.isdigit, not to int()
        monkeypatch.setenv("CADENCE_LOG_LEVEL", value)
        with pytest.warns(UserWarning, match=f"CADENCE_LOG_LEVEL={value!r}"):
            assert read_envs().logging_level == 20
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process
            assert read_envs().logging_level == 20
    env = dict(__import__("os").environ, CADENCE_LOG_LEVEL="bogus")
    done = subprocess.run([sys.executable, "-m", "cadence", "--version"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("cadence ")
    assert "CADENCE_LOG_LEVEL" in done.stderr and "Traceback" not in done.stderr


def test_the_tiny_models_folder_comes_from_the_environment_switches(monkeypatch, tmp_path):
    """CADENCE_CACHE_DIR is read in cadence.envs, and the tiny model's folder follows it."""
    from cadence.model.tiny import default_cache_root

    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv("CADENCE_CACHE_DIR")
    assert str(default_cache_root()) == read_envs().cache_dir


def test_no_module_but_envs_reads_a_cadence_switch() -> None:
    """The switches are read in one place (README): a read elsewhere would miss its checks."""
    import re
    from pathlib import Path

    import cadence

    read = re.compile(r"(environ\.get|getenv|environ\[)\(?\s*[\"']CADENCE_")
    root = Path(cadence.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "envs.py" and read.search(p.read_text())]
    assert offenders == []


_SWITCHES = ["disable_custom_all_reduce", "disable_skinny_gemm", "disable_skinny_glu",
             "disable_fused_norm", "disable_fused_rope", "disable_mlp_block",
             "disable_bulk_gemv", "disable_pdl", "disable_launch_tapes", "disable_dense_prefill",
             "disable_triton_dense_prefill", "disable_split_k", "disable_output_rows"]


@pytest.mark.parametrize("field", _SWITCHES)
def test_each_disable_switch_turns_off_its_own_path_alone(monkeypatch, field: str) -> None:
    """CADENCE_DISABLE_X sets ``disable_x`` and nothing else."""
    for other in _SWITCHES:
        monkeypatch.delenv(f"CADENCE_{other.upper()}", raising=False)
    monkeypatch.setenv(f"CADENCE_{field.upper()}", "1")
    envs = read_envs()
    assert {f for f in _SWITCHES if getattr(envs, f)} == {field}


def test_cadences_api_key_variable_wins_over_vllms(monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_API_KEY", "ours")
    monkeypatch.setenv("VLLM_API_KEY", "vllms")
    assert read_envs().api_key == "ours"
    monkeypatch.delenv("CADENCE_API_KEY")
    assert read_envs().api_key == "vllms"
    monkeypatch.delenv("VLLM_API_KEY")
    assert read_envs().api_key == ""


def test_the_cache_folder_defaults_to_the_users_cache(monkeypatch, tmp_path) -> None:
    """Unset (or empty), CADENCE_CACHE_DIR is ~/.cache/cadence (README)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CADENCE_CACHE_DIR", raising=False)
    assert read_envs().cache_dir == str(tmp_path / ".cache" / "cadence")
    monkeypatch.setenv("CADENCE_CACHE_DIR", "")
    assert read_envs().cache_dir == str(tmp_path / ".cache" / "cadence")


def test_cpu_threads_takes_a_whole_number_only(monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_CPU_THREADS", " 3 ")
    assert read_envs().cpu_threads == 3
    for bad in ("2.5", "4.0", "four"):
        monkeypatch.setenv("CADENCE_CPU_THREADS", bad)
        with pytest.raises(ValueError, match="CADENCE_CPU_THREADS must be an integer"):
            read_envs().cpu_threads  # noqa: B018
