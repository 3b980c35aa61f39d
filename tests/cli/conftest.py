from collections.abc import Iterator

import pytest

from tests.cli.clihelp import cleanup_spawned


@pytest.fixture(autouse=True)
def _close_spawned_processes() -> Iterator[None]:
    yield
    cleanup_spawned()
