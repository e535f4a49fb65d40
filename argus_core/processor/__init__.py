"""The per-host processor service: ingest, windows, compression, Perfetto files, storage."""
