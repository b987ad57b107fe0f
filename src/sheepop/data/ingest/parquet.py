"""Parquet -> one document per row, read one row group at a time with pyarrow.

The document is the string in column `text_field`; a dotted path names a field of a struct
column ("meta.body"). Only that column is read, one row group at a time and handed on in
slices of SLICE_ROWS, so memory is bounded by the largest row group, not the file. A null (in
the column or in a parent struct) gives no document: it is counted in the file's `RecordSkips`
with its row number (1-based). A missing column or a column that is not a string skips the whole
file with one reason that lists the columns there are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sheepop.data.ingest.jsonl import field_path
from sheepop.data.ingest.record import RecordSkips, Skipped

SLICE_ROWS = 4096


def _names(struct_type) -> str:
    return ", ".join(struct_type.field(i).name for i in range(struct_type.num_fields)) or "none"


class ParquetFile:
    """Iterate (row number, text) for each row whose text column holds a string."""

    def __init__(self, path: str | Path, text_field: str = "text") -> None:
        self.path = Path(path)
        self.text_field = text_field
        self.field = field_path(text_field)

    def _check_schema(self, schema) -> None:
        import pyarrow as pa

        top, *rest = self.field
        if top not in schema.names:
            raise Skipped("no text column", f"no column '{top}' (columns: "
                          f"{', '.join(schema.names) or 'none'})")
        kind = schema.field(top).type
        for depth, key in enumerate(rest, 1):
            where = ".".join(self.field[:depth])
            if not pa.types.is_struct(kind):
                raise Skipped("no text column", f"'{where}' is {kind}, not a struct")
            if kind.get_field_index(key) < 0:
                raise Skipped("no text column", f"no field '{key}' in '{where}' (fields: "
                              f"{_names(kind)})")
            kind = kind.field(key).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise Skipped("not a text column", f"'{self.text_field}' is {kind}, not a string")

    def documents(self, skips: RecordSkips) -> Iterator[tuple[int, str]]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise Skipped("corrupt Parquet", str(e)) from None
        with parquet:
            self._check_schema(parquet.schema_arrow)
            top, *rest = self.field
            row = 0
            for group in range(parquet.num_row_groups):
                try:
                    column = parquet.read_row_group(group, columns=[top]).column(0)
                except (pa.ArrowException, OSError) as e:
                    raise Skipped("corrupt Parquet", f"row group {group}: {e}") from None
                for chunk in column.chunks:
                    values = pc.struct_field(chunk, rest) if rest else chunk
                    for start in range(0, len(values), SLICE_ROWS):
                        for text in values.slice(start, SLICE_ROWS).to_pylist():
                            row += 1
                            if text is None:
                                skips.add("null", row)
                            else:
                                yield row, text
