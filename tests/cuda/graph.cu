// The graph executor on device tensors: tests/graph/test_priced_bytes.cpp built again
// with TESSERA_TEST_CUDA, so every operator of the library runs under every candidate
// strategy on the GPU (through the staged communicator), moves the bytes the graph
// prices, and gives the one-rank run on the host.
#define TESSERA_TEST_CUDA 1
#include "graph/test_priced_bytes.cpp"
