"""Calibrated two-sample tests of a window against its reference, and the suite that combines them."""
