"""`orchard db copy` from a crafted source: the SQL names only the schema's own columns, so a column
name written to be SQL (`x") ; DROP TABLE runs; --`) is refused as one line and the destination
(either backend) is left as it was."""

from __future__ import annotations

import sqlite3

import pytest

from engine.cli import main
from engine.store import Store, StoreError
from engine.store.copy import copy_store

EVIL = 'x") ; DROP TABLE runs; --'


def _crafted(path: str, column: str) -> str:
    with Store(path) as store:
        store.con.execute("INSERT INTO runs VALUES ('r1', 'n', 'line', 'm', '{}', '[]', 'done', 1, 1, NULL)")
    con = sqlite3.connect(path)
    con.execute(f'ALTER TABLE runs ADD COLUMN "{column.replace(chr(34), chr(34) * 2)}" TEXT')
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("column", [EVIL, "extra"])
def test_a_source_column_the_schema_lacks_is_refused_and_the_destination_untouched(tmp_path, db, column, capsys):
    src = _crafted(str(tmp_path / "crafted.db"), column)
    with Store(db) as store:  # the destination exists, migrated and empty
        store.con.execute("SELECT COUNT(*) FROM runs").fetchone()
    with pytest.raises(StoreError) as e:
        copy_store(src, db)
    message = str(e.value)
    assert "\n" not in message and "table runs" in message and repr(column) in message, message
    with Store(db) as store:
        assert store.con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0  # the table is still there
    assert main(["db", "copy", src, str(tmp_path / "new.db")]) == 2
    assert "table runs has column" in capsys.readouterr().err
    assert not (tmp_path / "new.db").exists()
