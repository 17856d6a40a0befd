// CUDA kernel micro-benchmark (being written).
int main() { return 0; }
