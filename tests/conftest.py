import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reservoir.device import xla_usable  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Skip XLA tests where torch_xla cannot run; in CI's XLA environment, refuse to skip them."""
    if xla_usable():
        return
    if os.environ.get("RESERVOIR_REQUIRE_XLA"):
        raise pytest.UsageError("RESERVOIR_REQUIRE_XLA is set but torch_xla is not usable "
                                "(is torch_xla installed and PJRT_DEVICE=CPU set?)")
    skip = pytest.mark.skip(reason="torch_xla not installed or no XLA device (set PJRT_DEVICE=CPU)")
    for item in items:
        if "xla" in item.keywords:
            item.add_marker(skip)
