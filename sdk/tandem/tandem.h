// The whole public API of Tandem: #include "tandem/tandem.h".
#pragma once

#include "tandem/autograd/replica_sum.h"
#include "tandem/autograd/tape.h"
#include "tandem/autograd/variable.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/checkpoint_manager.h"
#include "tandem/checkpoint/inspect.h"
#include "tandem/checkpoint/keras_weights.h"
#include "tandem/checkpoint/preemption.h"
#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/collectives/reduce_op.h"
#include "tandem/core/build_info.h"
#include "tandem/core/check_numerics.h"
#include "tandem/core/cpu_isa.h"
#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/exit_status.h"
#include "tandem/core/logging.h"
#include "tandem/core/per_replica.h"
#include "tandem/core/shape.h"
#include "tandem/core/threading.h"
#include "tandem/data/batch.h"
#include "tandem/data/dataset.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/data/example.h"
#include "tandem/data/image.h"
#include "tandem/data/iterator_state.h"
#include "tandem/data/text.h"
#include "tandem/data/tfrecord.h"
#include "tandem/distribute/average_loss.h"
#include "tandem/distribute/cluster_resolver.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/distribute/strategy.h"
#include "tandem/io/tfrecord.h"
#include "tandem/losses/losses.h"
#include "tandem/metrics/metrics.h"
#include "tandem/nn/activations.h"
#include "tandem/nn/attention.h"
#include "tandem/nn/initializers.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/module.h"
#include "tandem/nn/normalization.h"
#include "tandem/nn/policy.h"
#include "tandem/nn/replica_state.h"
#include "tandem/nn/sequential.h"
#include "tandem/ops/ops.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/optim/adam.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/lion.h"
#include "tandem/optim/loss_scale_optimizer.h"
#include "tandem/optim/optimizer.h"
#include "tandem/optim/parameter_layout.h"
#include "tandem/optim/schedules.h"
#include "tandem/optim/sgd.h"
#include "tandem/profile/profiler.h"
#include "tandem/summary/summary_writer.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"
#include "tandem/text/char_tokenizer.h"

/// \namespace tandem
/// Tandem's public API: tensors (Tensor, DType, Shape, Device), variables and GradientTape, the
/// strategies (MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy) with
/// ReplicaContext and PerReplica, compute_average_loss, and checkpoints (Checkpoint,
/// CheckpointManager). The layers below have namespaces of their own.
///
/// \namespace tandem::autograd
/// Gradient recording details that ops and custom gradients use (the public entry point is
/// tandem::GradientTape).
///
/// \namespace tandem::collectives
/// Collective communication between replicas and workers: the Communicator interface, its
/// in-process back end, and ReduceOp.
///
/// \namespace tandem::collectives::in_process
/// The in-process back end's tuning knobs (replicas that are threads of one process).
///
/// \namespace tandem::cuda
/// Process-wide CUDA settings (TF32 GEMMs).
///
/// \namespace tandem::data
/// The input pipeline: Dataset (sources and tf.data-style transformations), Iterator, Batch,
/// and the Fashion-MNIST, IDX and HDF5 readers.
///
/// \namespace tandem::losses
/// Losses with Keras's numerics: per-example functions and the Loss classes that reduce them.
///
/// \namespace tandem::metrics
/// Keras-style streaming metrics whose state is summed across replicas and workers.
///
/// \namespace tandem::nn
/// Layers and models (Module handles over ModuleImpl classes), activations, initialisers and
/// dtype policies, with Keras's names, numerics and defaults.
///
/// \namespace tandem::ops
/// Every tensor op, forward and backward: element-wise math, reductions, matmul and
/// convolution, shape ops, neural-network ops and comparisons.
///
/// \namespace tandem::optim
/// Optimizers (SGD, Adam, AdamW, LossScaleOptimizer), their options, gradient clipping and
/// learning-rate schedules.
///
/// \namespace tandem::optim::schedules
/// Learning-rate schedules as pure functions of the update step (Keras's formulas).
///
/// \namespace tandem::philox
/// The Philox4x32-10 counter-based generator behind Generator, shared by host and device.
///
/// \namespace tandem::profile
/// The step timeline (Profiler): where each replica's time went, as a Chrome trace and a
/// per-epoch breakdown with advice.
///
/// \namespace tandem::summary
/// TensorBoard summaries (Writer): scalars, histograms and text, written by the chief alone.
