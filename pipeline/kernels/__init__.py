"""Device kernels and CUDA-graph helpers the runners use."""
