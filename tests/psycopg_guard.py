"""Imported by PostgreSQL-only test modules: skips them, with the reason, where psycopg 3 is missing."""

import pytest

pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'orchard[postgres]')")
