"""Test configuration: Hypothesis profiles and the test lanes.

Hypothesis profiles: local runs draw new examples each time (exploration); CI
(``KVTRACE_CI=1``, set by ``.ci/run``) replays a fixed, seeded set, so a landing
decision never depends on which random examples a run happened to draw. Tests that pin
their own ``settings`` keep them and inherit the profile's ``derandomize``.

Lanes: ``make test`` runs everything (CI); ``make test-fast`` deselects the kinds of test
below (markers registered in pyproject.toml). A test file or a test gets its kinds from
:data:`KINDS` (or from its own ``pytest.mark``), so a test file needs no edit to join a
kind:

- ``slow``: the real shared trace, the wheel built and installed, a fuzzing search;
- ``subprocess``: starts processes (the real command, worker processes, a cluster, a
  shell), each paying an interpreter start and kvtrace's import;
- ``nojit``: runs kernels as Python (``NUMBA_DISABLE_JIT=1``);
- ``browser``: drives headless Chromium;
- ``large``: builds an input of millions of accesses or tokens.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# Prepared traces (kvtrace.ingest.prepared) of the test run live in a directory of its
# own, removed at exit: tests never read or fill the user's store, and the commands they
# start inherit it.
_PREPARED = tempfile.mkdtemp(prefix="kvtrace-test-prepared-")
os.environ["KVTRACE_CACHE_DIR"] = _PREPARED
atexit.register(shutil.rmtree, _PREPARED, True)

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("KVTRACE_CI") == "1":
    settings.load_profile("ci")

#: The kinds of a test file (``test_x.py``) or of one test (``test_x.py::test_name``, all its
#: parametrisations). A test takes its file's kinds and its own.
KINDS: dict[str, tuple[str, ...]] = {
    "test_app_browser.py": ("browser",),
    "test_nojit.py": ("nojit",),
    "test_interrupt.py": ("subprocess", "large"),
    "test_spill.py": ("subprocess",),
    "test_fuzz.py": ("slow",),
    "test_app.py::test_app_command_starts_streamlit": ("subprocess",),
    "test_app.py::test_app_command_stops_streamlit_on_sigterm": ("subprocess",),
    "test_app.py::test_app_modules_never_import_streamlit": ("subprocess",),
    "test_app_logs.py::test_the_app_command_passes_the_request_log_options": ("subprocess",),
    "test_cli.py::test_ingest_debug_shows_the_traceback": ("subprocess",),
    "test_distributed.py::test_dask_curve_equals_the_serial_run": ("subprocess",),
    "test_distributed.py::test_dask_sweep_equals_one_process": ("subprocess",),
    "test_distributed.py::test_cli_engine_dask": ("subprocess",),
    "test_distributed.py::test_partition_kernels_agree_with_and_without_jit": ("nojit",),
    "test_export.py::test_hit_rate_at_is_exact_at_every_metric": ("large",),
    "test_guard_bounds.py::test_a_parquet_too_large_is_refused_from_its_metadata_within_the_budget":
        ("subprocess", "large"),
    "test_guard_bounds.py::test_a_gzip_too_large_is_refused_from_a_first_read_within_the_budget":
        ("subprocess", "large"),
    "test_guard_bounds.py::test_a_gzip_bomb_the_estimate_misses_stops_at_the_hard_bound": ("subprocess", "large"),
    "test_guard_bounds.py::test_a_single_row_group_streams_within_the_budget": ("subprocess", "large"),
    "test_guard_bounds.py::test_jsonl_estimates_from_a_bounded_sample": ("large",),
    "test_hardening.py::test_same_input_same_bytes": ("subprocess",),
    "test_input_kinds.py::test_process_substitution_and_stdin_in_a_real_shell": ("subprocess",),
    "test_input_kinds.py::test_ctrl_c_ends_the_wait_for_a_fifo_writer": ("subprocess",),
    "test_input_kinds.py::test_parquet_from_a_pipe_is_refused_naming_the_file": ("subprocess",),
    "test_input_kinds.py::test_the_duplicate_check_keeps_a_large_trace_fast": ("large",),
    "test_outputs.py::test_stale_temporary_files_of_dead_processes_are_removed": ("subprocess",),
    "test_packaging.py::test_app_without_its_extra_is_one_line_naming_it": ("subprocess",),
    "test_packaging.py::test_a_chart_file_without_vl_convert_is_one_line_naming_png": ("subprocess",),
    "test_readme_examples.py::test_an_example_is_safe_in_a_shell": ("subprocess",),
    "test_readme_examples.py::test_the_runnable_examples_run_as_printed": ("subprocess",),
    "test_stackdist.py::test_kernel_without_jit": ("nojit",),
    "test_tiers.py::test_kernel_runs_the_same_without_the_jit": ("nojit",),
    "test_tiers.py::test_sweep_in_processes_equals_serial": ("subprocess",),
    "test_tiers.py::test_parallel_sweep_maps_the_trace_and_values_and_removes_its_files": ("subprocess",),
    "test_tokens_vllm.py::test_kernels_without_jit": ("nojit",),
    "test_tokens_vllm.py::test_hashing_speed_10m_tokens": ("large",),
    "test_value.py::test_windows_python_body_matches_jit": ("nojit",),
    "test_value_stream.py::test_streamed_kernels_without_the_jit": ("nojit",),
    "test_whatif_stream.py::test_streamed_sweep_in_two_processes_equals_serial": ("subprocess",),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        file = item.path.name
        for key in (file, f"{file}::{getattr(item, 'originalname', item.name)}"):
            for kind in KINDS.get(key, ()):
                item.add_marker(getattr(pytest.mark, kind))
