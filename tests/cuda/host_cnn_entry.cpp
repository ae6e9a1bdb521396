// A file of the host compiler in host_cnn.cu's program: including backend<cpu_device>
// with oneDNN (tessera::dnnl) enters oneDNN's kernels in the program's table.
#include <tessera/kernels/cpu/backend.hpp>
