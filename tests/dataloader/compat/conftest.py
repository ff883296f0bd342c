"""The grain alias, installed for one test and uninstalled after it."""

from __future__ import annotations

import os
import sys

import pytest

from dataloader.compat import ENV_VAR, install_grain_alias, is_installed, uninstall_grain_alias


@pytest.fixture
def alias():
    """Installs the alias; afterwards no finder, no alias module and no variable is left."""
    assert "grain" not in sys.modules, "a test before this one left grain imported"
    env_before = os.environ.get(ENV_VAR)
    install_grain_alias()
    try:
        yield
    finally:
        uninstall_grain_alias()
    assert not is_installed()
    assert not [n for n in sys.modules if n == "grain" or n.startswith("grain.")]
    assert os.environ.get(ENV_VAR) == env_before
