"""Privacy of uploads: clipping and Gaussian noise, the (epsilon, delta) accountant, decoy rows,
secure summation, and the leakage measurement of what an upload reveals."""
