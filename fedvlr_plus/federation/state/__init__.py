"""Private state that never leaves a client: initial values, the in-memory and on-disk stores,
safetensors files streamed row by row, and the choice of store for a population."""
