"""GPUd family: the health GPUd reports for what it watches, and its recent events."""
