"""The daemon as a whole: lifecycle, ingest, offsets, checkpoints, outages, golden values."""
