// The umbrella header: includes all of tessera. Only includes.
//
// Order: the headers that need only the standard library (and nlohmann/json, a
// required dependency) first, unconditionally, then the headers that need xtensor or
// MPI inside __has_include blocks. tools/amalgamate.py inlines each header where it
// is first included, so a header first included inside a conditional block must not
// be needed unconditionally later.
#pragma once

// core/: the layout algebra (standard library only)
#include <tessera/core/config.hpp>
#include <tessera/core/version.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/text_cursor.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/refine.hpp>

// plan/: the redistribution planner and its cost (standard library only)
#include <tessera/plan/cost.hpp>
#include <tessera/plan/step.hpp>
#include <tessera/plan/planner.hpp>
#include <tessera/plan/cache.hpp>
#include <tessera/plan/format.hpp>

// comm/: the communicator concept, the one-rank communicator, the mesh's
// communicators and the any_communicator handle (standard library only)
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/any_communicator.hpp>

// ops/: operators' definitions and sharding rules (standard library only)
#include <tessera/ops/definition.hpp>
#include <tessera/ops/matmul_rule.hpp>
#include <tessera/ops/elementwise_rule.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>
#include <tessera/ops/softmax_rule.hpp>
#include <tessera/ops/split_check.hpp>
#include <tessera/ops/batch_matmul_rule.hpp>
#include <tessera/ops/one_hot_rule.hpp>
#include <tessera/ops/softmax_axis_rule.hpp>
#include <tessera/ops/shape_rule.hpp>
#include <tessera/ops/argmax_rule.hpp>
#include <tessera/ops/sparse_cross_entropy_rule.hpp>
#include <tessera/ops/all_reduce_rule.hpp>
#include <tessera/ops/dropout_rule.hpp>
#include <tessera/ops/batch_norm_rule.hpp>
#include <tessera/ops/window_rule.hpp>
#include <tessera/ops/conv2d_rule.hpp>
#include <tessera/ops/pool2d_rule.hpp>
#include <tessera/ops/operators.hpp>

// io/: the checkpoint file format, checkpoint metadata and rotation, strategy files,
// rank tables (standard library and nlohmann/json)
#include <tessera/io/json.hpp>
#include <tessera/io/layout_text.hpp>
#include <tessera/io/atomic_file.hpp>
#include <tessera/io/safetensors.hpp>
#include <tessera/io/checkpoint_file.hpp>
#include <tessera/io/rotation.hpp>
#include <tessera/io/strategy_file.hpp>
#include <tessera/io/rank_table.hpp>

// graph/: the traced graph, its view of the operators, sharding propagation, the
// parallel pass and the dumps (standard library only)
#include <tessera/graph/op_def.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/graph/propagate.hpp>
#include <tessera/graph/recursive.hpp>
#include <tessera/graph/pipeline.hpp>
#include <tessera/graph/parallel.hpp>
#include <tessera/graph/dump.hpp>

// tensor/ and exec/: shards in xtensor containers (and the device model)
#if __has_include(<xtensor/xarray.hpp>)
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/host_storage.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/io/checkpoint.hpp>

// kernels/cpu/ and the sharded operators: local math through CBLAS
#if __has_include(<cblas.h>)
#include <tessera/kernels/cpu.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/matmul_pipelined.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/softmax.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/one_hot.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include <tessera/ops/shape.hpp>
#include <tessera/ops/argmax.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>
#include <tessera/ops/all_reduce.hpp>
#include <tessera/ops/dropout.hpp>
#include <tessera/ops/batch_norm.hpp>
#include <tessera/ops/halo.hpp>
#include <tessera/ops/conv2d.hpp>
#include <tessera/ops/pool2d.hpp>
#include <tessera/kernels/random.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/autodiff/tape.hpp>
#include <tessera/autodiff/ops.hpp>
#include <tessera/autodiff/losses.hpp>
#include <tessera/graph/execute.hpp>

// nn/, optim/ and train/: modules, losses, optimizers, the gradient reducer, Model
#include <tessera/kernels/cpu/optim.hpp>
#include <tessera/nn/init.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/conv.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/optimizer.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/optim/adam.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/memory.hpp>
#include <tessera/train/grad_reducer.hpp>
#include <tessera/train/callbacks.hpp>
#include <tessera/train/model.hpp>
#include <tessera/train/pipeline.hpp>
#endif

// data/: datasets (MNIST, CIFAR-10, generators), sharding, transforms, prefetch
#include <tessera/data/column.hpp>
#include <tessera/data/random.hpp>
#include <tessera/data/node.hpp>
#include <tessera/data/prefetch.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/source.hpp>
#include <tessera/data/file.hpp>
#include <tessera/data/mnist.hpp>
#include <tessera/data/cifar10.hpp>
#include <tessera/data/transforms.hpp>
#include <tessera/data/synthetic.hpp>

// train/data.hpp and train/checkpoint.hpp: Model reading data/'s batches, and
// ModelCheckpoint saving through io/
#if __has_include(<cblas.h>)
#include <tessera/train/data.hpp>
#include <tessera/train/checkpoint.hpp>
#endif
#endif

// comm/mpi.hpp: the MPI communicator; comm/launch.hpp: tessera::run
#if __has_include(<mpi.h>)
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/launch.hpp>
#endif
