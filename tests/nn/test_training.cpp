// End to end on one replica: a small MLP learns a separable 4-class problem (quadrants of the
// plane) with Adam, SparseCategoricalCrossentropy and SparseCategoricalAccuracy.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/core/threading.h"
#include "tandem/losses/losses.h"
#include "tandem/metrics/metrics.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/sequential.h"
#include "tandem/optim/adam.h"

namespace td = tandem;
namespace nn = tandem::nn;

namespace {
/// n points in [-1, 1]^2 at least `margin` away from both axes; label = quadrant (0..3).
void quadrants(int64_t n, uint64_t seed, double margin, td::Tensor& features, td::Tensor& labels) {
  td::Generator g(seed);
  std::vector<float> x;
  std::vector<int64_t> y;
  while (static_cast<int64_t>(y.size()) < n) {
    const double a = 2.0 * g.next_double() - 1.0, b = 2.0 * g.next_double() - 1.0;
    if (std::abs(a) < margin || std::abs(b) < margin) continue;
    x.push_back(static_cast<float>(a));
    x.push_back(static_cast<float>(b));
    y.push_back((a > 0 ? 1 : 0) + (b > 0 ? 2 : 0));
  }
  features = td::Tensor::from_vector(x, {n, 2});
  labels = td::Tensor::from_vector(y);
}
/// Sets the calling thread's compute-thread count for the scope.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int threads) : saved_(td::compute_threads()) {
    td::set_compute_threads(threads);
  }
  ~ThreadCountGuard() { td::set_compute_threads(saved_); }

 private:
  int saved_;
};
}  // namespace

TEST_CASE("A tiny MLP learns the quadrants to >= 99% accuracy", "[cpu][nn][optim]") {
  // A problem this small runs fastest on one thread (no parallel-region start-up per op).
  ThreadCountGuard one_thread(1);
  td::Tensor train_x, train_y, test_x, test_y;
  quadrants(1024, 1, 0.05, train_x, train_y);
  quadrants(512, 2, 0.05, test_x, test_y);

  nn::Sequential model({nn::Dense(32, nn::Activation::kRelu), nn::Dense(4)});
  model.set_seed(3);
  model.build({2});
  td::optim::Adam optimizer({.learning_rate = 0.02});
  td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  td::metrics::Mean train_loss("train_loss");
  td::metrics::SparseCategoricalAccuracy accuracy("test_accuracy");

  const int64_t batch = 64;
  for (int epoch = 0; epoch < 15; ++epoch) {
    train_loss.reset_state();
    for (int64_t begin = 0; begin < 1024; begin += batch) {
      const td::Tensor x = train_x.slice(begin, begin + batch);
      const td::Tensor y = train_y.slice(begin, begin + batch);
      td::GradientTape tape;
      const td::Tensor loss = loss_fn(y, model(x, /*training=*/true));
      const auto grads = tape.gradient(loss, model.trainable_variables());
      optimizer.apply_gradients(grads, model.trainable_variables());
      train_loss.update_state(loss);
    }
  }
  CHECK(optimizer.iterations() == 15 * 16);
  accuracy.update_state(test_y, model(test_x));
  CHECK(accuracy.result() >= 0.99);
  CHECK(train_loss.result() < 0.1);
}
