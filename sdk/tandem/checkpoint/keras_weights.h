// load_weights: a model's weights from a file Keras wrote (Keras's model.load_weights), so that
// a Tandem model of the same architecture starts from weights trained in Keras.
#pragma once

#include <string>

namespace tandem {

namespace nn {
class Module;
}  // namespace nn

/// How load_weights treats the values it reads.
struct LoadWeightsOptions {
  /// Load NaN and Inf values too (by default a weight holding any raises, naming it and how
  /// many it holds: a model trained into NaN, or a damaged file, would otherwise start from it).
  bool allow_non_finite = false;
};

/// Loads the weights in the HDF5 file `path`, written by Keras, into `model` (a built Sequential,
/// or a single layer), as Keras's model.load_weights(path) does. Reads the layouts Keras writes:
///   - Keras 3 model.save_weights("x.weights.h5"): `/layers/<layer>/vars/0`, 1, ...
///   - legacy .h5 weights (Keras 3's legacy h5 writer, tf-keras model.save_weights("x.h5")): a
///     root attribute layer_names and a group per layer whose weight_names list its datasets;
///   - legacy .h5 full model (model.save("x.h5")): the same under /model_weights (a Tandem
///     checkpoint has that layout too).
/// Layers are matched as Keras matches them: in a legacy file, the layers that have weights, in
/// the order of layer_names, against the model's layers that have weights, in order (a nested
/// model is one such layer, its weights all of its layers' weights); in a .weights.h5 file, by
/// the path Keras gives each layer (its class, then "_1", "_2", ... for the second, third
/// layer of that class; a nested model's layers below its own: /layers/sequential/layers/
/// dense). Names themselves need not agree.
///
/// Every value is read and checked before any is assigned: a file of another model (a shape,
/// the number of layers or of weights differs) raises CheckpointMismatchError naming the file,
/// the first layer that differs (its index in the model and its names in the model and in the
/// file) and both shapes, and leaves the model unchanged; a file in none of these layouts raises
/// tandem::Error. In a model created inside strategy.scope() every replica's copy of each
/// variable gets the same values. Call it from the main thread, outside strategy.run.
///
/// The file is read as a file of another program: only datasets stored in it (no external
/// storage or links, no virtual datasets, only lossless filters), and a weight holding NaN or
/// Inf raises (unless options.allow_non_finite), naming the dataset and the count.
void load_weights(const nn::Module& model, const std::string& path,
                  const LoadWeightsOptions& options = {});

}  // namespace tandem
