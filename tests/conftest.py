import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tests run two per machine (`pytest -n 2`): torch's default threads then fight for the two
    cores and everything runs 10x slower. One thread each (modules opt in with `usefixtures`)."""
    from engine.torch_threads import torch_threads

    with torch_threads(1):
        yield


from pg_fixture import backend, db, new_db, pg_server  # noqa: F401 - the store fixtures on both backends
