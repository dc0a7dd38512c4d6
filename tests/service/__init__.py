"""The daemon as a whole: lifecycle, CLI, settings, ingest, offsets, checkpoints, outages, security."""
