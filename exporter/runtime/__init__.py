"""The process around the collection: signals, logging, the heap, the CPU the worker offers."""
