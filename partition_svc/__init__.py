"""partition_svc: partition leaders. RocksDB-backed logs with idempotent
appends, fetch, offsets, consumer-group offsets, topic metadata."""
