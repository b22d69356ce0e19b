"""What the lab keeps on disk: atomic writes, one-writer directory locks, the shared cache, a run directory's files."""
