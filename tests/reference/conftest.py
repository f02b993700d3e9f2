"""pytest set-up for tests/reference: import path, determinism, and the `moecore_bin` fixture.

Tests that need the C++ binary take the `moecore_bin` fixture. A missing binary is a FAILURE, unless
MOECORE_ALLOW_MISSING_BIN=1 is set, in which case those tests are skipped.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import moecore_harness as H  # noqa: E402

torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
torch.use_deterministic_algorithms(True, warn_only=True)


@pytest.fixture(scope="session")
def moecore_bin() -> Path:
    reason = H.binary_missing_reason()
    if reason:
        if os.environ.get("MOECORE_ALLOW_MISSING_BIN") == "1":
            pytest.skip(reason + " [skipped: MOECORE_ALLOW_MISSING_BIN=1]")
        pytest.fail(reason + " (set MOECORE_ALLOW_MISSING_BIN=1 to skip tests that need it)")
    return H.binary_path()
