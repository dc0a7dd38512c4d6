"""River change detectors on per-record signals: what runs between drift cycles."""
