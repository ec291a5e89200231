"""gosim: Go's concurrency model and runtime machinery on trio."""
