"""Parquet files whose schema pyarrow cannot write (a DECIMAL stored as variable-length BINARY, a
FIXED_LEN_BYTE_ARRAY longer than its precision needs), written through parquet-mr on the JVM of a running
SparkSession: ``forge(spark, path, "message m { required int32 uid; optional binary a (DECIMAL(10,2)); }", rows)``,
each row a dict of field name to a value (an int, the ``bytes`` of a binary leaf, a dict for a group, a list of
dicts for a repeated group, None to leave a field unset)."""

from __future__ import annotations

from typing import Any


def _fill(jvm: Any, group: Any, row: dict[str, Any]) -> None:
    binary = jvm.org.apache.parquet.io.api.Binary
    for name, value in row.items():
        if value is None:
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, dict):
                _fill(jvm, group.addGroup(name), v)
            elif isinstance(v, bytes):
                group.add(name, binary.fromConstantByteArray(bytearray(v)))
            else:
                group.add(name, int(v))


def forge(spark: Any, path: str, schema: str, rows: list[dict[str, Any]]) -> None:
    jvm = spark.sparkContext._jvm
    message = jvm.org.apache.parquet.schema.MessageTypeParser.parseMessageType(schema)
    writer = (jvm.org.apache.parquet.hadoop.example.ExampleParquetWriter.builder(jvm.org.apache.hadoop.fs.Path(path))
              .withType(message).withConf(spark.sparkContext._jsc.hadoopConfiguration()).build())
    factory = jvm.org.apache.parquet.example.data.simple.SimpleGroupFactory(message)
    try:
        for row in rows:
            g = factory.newGroup()
            _fill(jvm, g, row)
            writer.write(g)
    finally:
        writer.close()


def stored(v: int, length: int) -> bytes:
    """A DECIMAL's unscaled integer as ``length`` big-endian two's complement bytes."""
    return v.to_bytes(length, "big", signed=True)
