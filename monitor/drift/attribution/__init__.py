"""After a verdict: which regions of the space moved, and exemplars of what moved."""
