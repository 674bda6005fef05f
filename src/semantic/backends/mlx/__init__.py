"""The MLX backend (Apple Silicon; also mlx[cpu] on Linux): the model over a paged KV pool of MLX
arrays."""
