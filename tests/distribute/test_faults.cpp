// Faults a training loop must survive with a clear error: TANDEM_CHECK_NUMERICS naming the
// replica, the step and the variable of the first NaN or Inf; a replica stuck in user code,
// which run() gives up on after the collective timeout instead of waiting forever.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/scoped_timeout.h"
#include "tandem/tandem.h"

namespace td = tandem;
using td::testing::ScopedTimeout;

namespace {

/// Turns the numerics checks on or off while alive.
class ScopedCheckNumerics {
 public:
  explicit ScopedCheckNumerics(bool on) : previous_(td::set_check_numerics(on)) {}
  ~ScopedCheckNumerics() { td::set_check_numerics(previous_); }

 private:
  bool previous_;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// One training step of a 3 -> 2 Dense layer on 2 CPU replicas; replica `bad` gets `poison`
/// in its features from step `bad_step` on (1-based). Returns the error of the step that
/// raised ("" when all `steps` ran) and the steps that ran.
struct Outcome {
  std::string error;
  int steps_done = 0;
};
Outcome train(int steps, int bad, int bad_step, float poison, bool in_loss) {
  auto strategy = td::MirroredStrategy::cpu(2);
  auto scope = strategy.scope();
  td::nn::Sequential model({td::nn::Dense(2)});
  model.build({3});
  td::optim::SGD optimizer({.learning_rate = 0.1});
  optimizer.build(model.trainable_variables());
  Outcome outcome;
  for (int step = 1; step <= steps; ++step) {
    try {
      strategy.run([&](td::ReplicaContext& ctx) {
        std::vector<float> x(6, 0.5f);
        if (in_loss && ctx.replica_id_in_sync_group() == bad && step >= bad_step) x[4] = poison;
        td::GradientTape tape;
        const td::Tensor features = td::Tensor::from_vector(x, {2, 3});
        const td::Tensor out = model(features, /*training=*/true);
        td::Tensor loss;
        if (in_loss) {
          loss = td::compute_average_loss(td::ops::sum(out, 1), 4);
        } else {
          // A finite loss; the poison is put into one gradient below.
          loss = td::compute_average_loss(td::ops::sum(td::ops::mul(out, 0.0), 1), 4);
        }
        std::vector<td::Tensor> grads = tape.gradient(loss, model.trainable_variables());
        if (!in_loss && ctx.replica_id_in_sync_group() == bad && step >= bad_step) {
          std::vector<float> g = grads[1].to_vector<float>();
          g[1] = poison;
          grads[1] = td::Tensor::from_vector(g, grads[1].shape());
        }
        optimizer.apply_gradients(ctx, grads, model.trainable_variables());
        return loss;
      });
    } catch (const td::Error& e) {
      outcome.error = e.what();
      return outcome;
    }
    outcome.steps_done = step;
  }
  return outcome;
}

}  // namespace

TEST_CASE("TANDEM_CHECK_NUMERICS names the replica and the step of a non-finite loss",
          "[cpu][distribute]") {
  // Off by default: nothing turns it on unless TANDEM_CHECK_NUMERICS is set.
  if (std::getenv("TANDEM_CHECK_NUMERICS") == nullptr) CHECK_FALSE(td::check_numerics_enabled());
  {
    ScopedCheckNumerics off(false);
    // Off: a NaN trains on silently.
    CHECK(train(/*steps=*/3, /*bad=*/1, /*bad_step=*/2, kNaN, /*in_loss=*/true).error.empty());
  }
  ScopedCheckNumerics on(true);
  const Outcome nan = train(3, 1, 2, kNaN, true);
  CHECK(nan.steps_done == 1);
  CHECK_THAT(nan.error, Catch::Contains("TANDEM_CHECK_NUMERICS: non-finite loss") &&
                            Catch::Contains("on replica 1") &&
                            Catch::Contains("hold 1 NaN and 0 Inf of 2"));
  const Outcome inf = train(3, 0, 3, kInf, true);
  CHECK(inf.steps_done == 2);
  CHECK_THAT(inf.error, Catch::Contains("on replica 0") && Catch::Contains("0 NaN and 1 Inf"));
}

TEST_CASE("TANDEM_CHECK_NUMERICS names the variable, replica and step of a non-finite gradient",
          "[cpu][distribute]") {
  ScopedCheckNumerics on(true);
  const Outcome nan = train(/*steps=*/4, /*bad=*/1, /*bad_step=*/3, kNaN, /*in_loss=*/false);
  CHECK(nan.steps_done == 2);
  CHECK_THAT(nan.error, Catch::Contains("non-finite gradient for dense/bias") &&
                            Catch::Contains("on replica 1 at step 3") &&
                            Catch::Contains("(1 NaN, 0 Inf of 2 values)"));
  const Outcome inf = train(4, 0, 1, -kInf, false);
  CHECK(inf.steps_done == 0);
  CHECK_THAT(inf.error, Catch::Contains("on replica 0 at step 1") &&
                            Catch::Contains("(0 NaN, 1 Inf of 2 values)"));
  // Outside a strategy, the plain apply_gradients checks too (no replica to name).
  td::Variable w("w", td::Tensor::from_vector(std::vector<float>{1, 2}));
  td::optim::SGD sgd({.learning_rate = 0.1});
  CHECK_THROWS_WITH(
      sgd.apply_gradients({td::Tensor::from_vector(std::vector<float>{kNaN, 0})}, {w}),
      Catch::Contains("non-finite gradient for w at step 1 (1 NaN"));
}

TEST_CASE("TANDEM_CHECK_NUMERICS under gradient accumulation names the update and the micro-step",
          "[cpu][distribute]") {
  ScopedCheckNumerics on(true);
  auto strategy = td::MirroredStrategy::cpu(2);
  auto scope = strategy.scope();
  td::Variable w = td::make_variable("w", td::Tensor::from_vector(std::vector<float>{1, 2}));
  td::optim::SGD sgd({.learning_rate = 0.1, .gradient_accumulation_steps = 2});
  sgd.build({w});
  // Micro-steps 1 and 2 make update 1; replica 1's gradient is infinite on micro-step 4, the
  // second micro-step of update 2.
  auto step = [&](int micro_step) {
    strategy.run([&](td::ReplicaContext& ctx) {
      const bool bad = ctx.replica_id_in_sync_group() == 1 && micro_step == 4;
      const td::Tensor g = td::Tensor::from_vector(std::vector<float>{bad ? kInf : 1.0f, 0});
      sgd.apply_gradients(ctx, {g}, {w});
    });
  };
  for (int micro_step = 1; micro_step <= 3; ++micro_step) step(micro_step);
  CHECK(sgd.iterations() == 1);
  CHECK_THROWS_WITH(step(4), Catch::StartsWith("replica 1: TANDEM_CHECK_NUMERICS: non-finite "
                                               "gradient for w on replica 1 at step 2 "
                                               "(micro-step 2 of 2) (0 NaN, 1 Inf of 2 values)"));
  // Raised before the all-reduce and the update: the weights hold one finite update.
  CHECK(sgd.iterations() == 1);
  const std::vector<float> value = w.value().to_vector<float>();
  // Update 1: each replica accumulated 1 + 1, summed over 2 replicas = 4, / 2 micro-steps = 2.
  CHECK(value[0] == Approx(1.0f - 0.1f * 2.0f));
  CHECK(value[1] == Approx(2.0f));
}

TEST_CASE(
    "a replica stuck in user code: run raises after the timeout and the strategy refuses "
    "later calls",
    "[cpu][distribute]") {
  ScopedTimeout timeout(std::chrono::milliseconds(1000));
  // The stuck replica waits on this until the test releases it (shared: it outlives the run).
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    bool open = false;
    std::atomic<bool> left{false};
  };
  auto gate = std::make_shared<Gate>();
  auto strategy = std::make_unique<td::MirroredStrategy>(
      std::vector<td::Device>{td::Device::cpu(0), td::Device::cpu(1)});
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  // The replica function outlives the run (a stuck replica may still be inside it when run
  // has returned): held here, not a temporary of the run call.
  auto stuck_fn =
      std::make_shared<std::function<int(td::ReplicaContext&)>>([gate](td::ReplicaContext& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          std::unique_lock<std::mutex> lock(gate->mutex);
          // Bounded, so that a run that waits for it (the bug) fails the test instead of hanging.
          gate->cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate->open; });
          gate->left = true;
        }
        return 0;
      });
  try {
    strategy->run(*stuck_fn);
  } catch (const td::TimeoutError& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Replica 0 returned at once: run gives replica 1 one timeout (1 s) more, not forever.
  CHECK(seconds >= 0.9);
  CHECK(seconds < 3.0);
  CHECK_THAT(error, Catch::Contains("replica 1 did not return from the replica function within "
                                    "1 s (TANDEM_COLLECTIVE_TIMEOUT) after replica 0 finished") &&
                        Catch::Contains("unusable from now on"));
  CHECK_FALSE(gate->left);
  // Every later call raises at once.
  const auto again = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(strategy->run([](td::ReplicaContext&) { return 0; }),
                    Catch::Contains("is unusable") && Catch::Contains("replica 1 did not return"));
  td::PerReplica<td::Tensor> values({td::Tensor::scalar(1.0), td::Tensor::scalar(2.0)});
  CHECK_THROWS_WITH(strategy->reduce(td::ReduceOp::kSum, values),
                    Catch::StartsWith("MirroredStrategy.reduce: the strategy is unusable"));
  CHECK_THROWS_WITH(strategy->gather(values), Catch::Contains("is unusable"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count() < 0.5);
  // Its destructor does not wait for the stuck thread.
  const auto ending = std::chrono::steady_clock::now();
  strategy.reset();
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - ending).count() < 0.5);
  // Released, the thread leaves its replica function and ends on its own.
  {
    std::lock_guard<std::mutex> lock(gate->mutex);
    gate->open = true;
  }
  gate->cv.notify_all();
  for (int i = 0; i < 200 && !gate->left; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(gate->left);
  // The thread may still be on its way out of the function: it keeps the function (and the
  // gate it holds) for the rest of the process, as the strategy keeps its state.
  static auto* kept = new std::vector<std::shared_ptr<const void>>();
  kept->push_back(stuck_fn);
}

TEST_CASE("a replica stuck in user code while its peer's collective times out",
          "[cpu][distribute]") {
  // The case: replica 0 raises from its collective at the timeout while replica 1 is
  // held in user code far longer. Replica 0's collective already waited a whole timeout for
  // replica 1, so run gives it half a second more (not another timeout, nor the whole wait).
  ScopedTimeout timeout(std::chrono::milliseconds(1500));
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    bool open = false;
    std::atomic<bool> left{false};
  };
  auto gate = std::make_shared<Gate>();
  auto fn =
      std::make_shared<std::function<int(td::ReplicaContext&)>>([gate](td::ReplicaContext& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          std::unique_lock<std::mutex> lock(gate->mutex);
          gate->cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate->open; });
          gate->left = true;
          return 0;
        }
        ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::scalar(1.0));
        return 0;
      });
  auto strategy = td::MirroredStrategy::cpu(2);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    strategy.run(*fn);
  } catch (const td::TimeoutError& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds >= 1.4);
  CHECK(seconds < 2.6);  // 1.5 s + 0.5 s; 3 s (two timeouts) before it gave up sooner
  CHECK_FALSE(gate->left);
  CHECK_THAT(error, Catch::StartsWith("MirroredStrategy.run: replica 1 did not return from the "
                                      "replica function: replica 0's collective timed out after "
                                      "1.5 s (TANDEM_COLLECTIVE_TIMEOUT) waiting for it") &&
                        Catch::Contains("replica 0 raised: all_reduce #1 timed out after 1.5") &&
                        Catch::Contains("replica 1 did not arrive"));
  const auto again = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(strategy.run(*fn), Catch::StartsWith("MirroredStrategy.run: the strategy is "
                                                         "unusable"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count() < 0.5);
  // Released, the stuck replica returns; the strategy then ends without waiting.
  {
    std::lock_guard<std::mutex> lock(gate->mutex);
    gate->open = true;
  }
  gate->cv.notify_all();
  for (int i = 0; i < 200 && !gate->left; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(gate->left);
  // The thread may still be on its way out of the function: it keeps it for the process.
  static auto* kept = new std::vector<std::shared_ptr<const void>>();
  kept->push_back(fn);
}
