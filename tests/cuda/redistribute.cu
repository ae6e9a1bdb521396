// The exhaustive redistribution test of tests/exec/test_redistribute.cpp, on the GPU:
// device shards, packed and unpacked by the CUDA kernels, moved through MPI with
// staging in host memory.
#define TESSERA_TEST_CUDA 1
#include "exec/test_redistribute.cpp"
