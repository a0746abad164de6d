// The program's own state in a checkpoint: double and float counters (bit-exact), TrackedState
// objects, and a Metric subclass written by the program, each resuming exactly; missing entries
// keep their values; a counter of another dtype or a state of another shape is refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace metrics = tandem::metrics;
using Catch::Matchers::Contains;
using td::checkpoint_testing::CaptureStderr;
using td::checkpoint_testing::TempDir;

namespace {

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// A program's early-stopping state: the best loss so far, the steps since, and a short history.
struct EarlyStopping : td::TrackedState {
  double best = std::numeric_limits<double>::infinity();
  int64_t since = 0;
  std::vector<float> history = {0, 0, 0};

  State save_state() const override {
    return {{"best", td::Tensor::from_vector<double>({best}, td::Shape{})},
            {"since", td::Tensor::from_vector<int64_t>({since}, td::Shape{})},
            {"history", td::Tensor::from_vector(history)}};
  }
  void restore_state(const State& state) override {
    best = state.at("best").item<double>();
    since = state.at("since").item<int64_t>();
    history = state.at("history").to_vector<float>();
  }
};

/// A metric written by the program: the weighted root mean square, sqrt(sum(w x^2) / sum(w)),
/// with its own state variables (summed over replicas like any metric's).
class WeightedRms : public metrics::Metric {
 public:
  explicit WeightedRms(std::string name = "rms")
      : Metric(std::move(name), {{.name = "weighted_squares"},
                                 {.name = "weights", .non_negative = true},
                                 {.name = "per_bucket", .shape = {2}, .non_negative = true}}) {}
  void update_state(const td::Tensor& values, const td::Tensor& weights) {
    metrics::MetricState& state = replica_state();
    const std::vector<double> x = values.to_vector<double>(), w = weights.to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i) {
      state.at("weighted_squares")[0] += w[i] * x[i] * x[i];
      state.at("weights")[0] += w[i];
      state.at("per_bucket")[x[i] < 0 ? 0 : 1] += 1;
    }
  }

 protected:
  double compute(const metrics::MetricState& s) const override {
    const double w = s.scalar("weights");
    return w == 0 ? 0.0 : std::sqrt(s.scalar("weighted_squares") / w);
  }
};

}  // namespace

TEST_CASE("Double and float counters round-trip bit for bit", "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  double best_loss = 0.1 + 0.2, lr = std::numeric_limits<double>::infinity(), nan_d = std::nan("7");
  float ema = 1.0f / 3.0f, negative_zero = -0.0f, tiny = std::numeric_limits<float>::denorm_min();
  int64_t steps = 17;
  td::Checkpoint({{"best_loss", &best_loss},
                  {"lr", &lr},
                  {"nan_d", &nan_d},
                  {"ema", &ema},
                  {"negative_zero", &negative_zero},
                  {"tiny", &tiny},
                  {"steps", &steps}})
      .write(path);
  double best_loss2 = 0, lr2 = 0, nan_d2 = 0;
  float ema2 = 0, negative_zero2 = 0, tiny2 = 0;
  int64_t steps2 = 0;
  td::Checkpoint({{"best_loss", &best_loss2},
                  {"lr", &lr2},
                  {"nan_d", &nan_d2},
                  {"ema", &ema2},
                  {"negative_zero", &negative_zero2},
                  {"tiny", &tiny2},
                  {"steps", &steps2}})
      .restore(path);
  CHECK(same_bits(best_loss2, best_loss));
  CHECK(same_bits(lr2, lr));
  CHECK(same_bits(nan_d2, nan_d));  // NaN payload included
  CHECK(same_bits(ema2, ema));
  CHECK(same_bits(negative_zero2, negative_zero));
  CHECK(same_bits(tiny2, tiny));
  CHECK(steps2 == 17);
  td::h5::File file = td::h5::File::open(path);
  const td::h5::Group counters = file.root().open_group("training_state/counters");
  CHECK(counters.dataset_dtype("best_loss") == td::DType::kFloat64);
  CHECK(counters.dataset_dtype("ema") == td::DType::kFloat32);
  CHECK(counters.dataset_shape("ema") == td::Shape{});
  CHECK(td::verify_checkpoint(path).empty());  // NaN and infinity are values a program may keep
  CHECK_THAT(td::inspect_checkpoint(path), Contains("counters/best_loss") &&
                                               Contains("0.30000000000000004 (float64)") &&
                                               Contains("counters/steps") && Contains("(float32)"));
}

TEST_CASE("A counter restored with another dtype raises naming both", "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  float value = 2.5f;
  td::Checkpoint({{"value", &value}}).write(path);
  double as_double = 7.0;
  CHECK_THROWS_AS(td::Checkpoint({{"value", &as_double}}).restore(path),
                  td::CheckpointMismatchError);
  CHECK_THROWS_WITH(td::Checkpoint({{"value", &as_double}}).restore(path),
                    Contains(path) && Contains("counters/value") && Contains("float32") &&
                        Contains("float64") && Contains("\"value\""));
  int64_t as_int = 3;
  CHECK_THROWS_WITH(td::Checkpoint({{"value", &as_int}}).restore(path),
                    Contains("float32") && Contains("int64"));
  CHECK(as_double == 7.0);
  CHECK(as_int == 3);
  // The standard counters are int64 only.
  double epoch = 0;
  CHECK_THROWS_WITH(td::Checkpoint({{"epoch", &epoch}}), Contains("epoch") && Contains("int64"));
}

TEST_CASE("A TrackedState object round-trips and a state of another shape is refused",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  EarlyStopping saved;
  saved.best = 0.125;
  saved.since = 4;
  saved.history = {0.5f, 0.25f, std::numeric_limits<float>::quiet_NaN()};
  double lr = 0.01;
  td::Checkpoint({{"early_stopping", &saved}, {"lr", &lr}}).write(path);
  {
    td::h5::File file = td::h5::File::open(path);
    const td::h5::Group user = file.root().open_group("training_state/user/early_stopping");
    CHECK(user.children() == std::vector<std::string>{"best", "history", "since"});
    CHECK(user.dataset_dtype("since") == td::DType::kInt64);
  }

  EarlyStopping restored;
  td::Checkpoint({{"early_stopping", &restored}}).restore(path);
  CHECK(restored.best == 0.125);
  CHECK(restored.since == 4);
  REQUIRE(restored.history.size() == 3);
  CHECK(restored.history[1] == 0.25f);
  CHECK(same_bits(restored.history[2], saved.history[2]));
  CHECK_THAT(td::inspect_checkpoint(path),
             Contains("user/early_stopping") && Contains("history float32 [3]"));

  // A history of another length: the default check names the key and both shapes, and nothing
  // changes (the counter tracked with it keeps its value too).
  EarlyStopping longer;
  longer.history = {1, 2, 3, 4};
  double lr2 = 5.0;
  CHECK_THROWS_AS(td::Checkpoint({{"lr", &lr2}, {"early_stopping", &longer}}).restore(path),
                  td::CheckpointMismatchError);
  CHECK_THROWS_WITH(td::Checkpoint({{"lr", &lr2}, {"early_stopping", &longer}}).restore(path),
                    Contains(path) && Contains("user state \"early_stopping\"") &&
                        Contains("\"history\"") && Contains("[3]") && Contains("[4]"));
  CHECK(longer.history.size() == 4);
  CHECK(lr2 == 5.0);

  // Keys that cannot be datasets are refused when saving.
  struct BadKey : td::TrackedState {
    State save_state() const override { return {{"a/b", td::Tensor::scalar(1.0)}}; }
    void restore_state(const State&) override {}
  } bad;
  CHECK_THROWS_WITH(td::Checkpoint({{"bad", &bad}}).write(dir.file("bad.h5")),
                    Contains("\"bad\"") && Contains("a/b"));
}

TEST_CASE("Tracked entries a checkpoint lacks keep their values and a warning names them",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  int64_t steps = 3;
  td::Checkpoint({{"steps", &steps}}).write(path);
  EarlyStopping state;
  state.best = 2.0;
  double best = 9.0;
  float ema = 0.5f;
  int64_t steps2 = 0;
  CaptureStderr capture;
  td::Checkpoint({{"steps", &steps2}, {"early", &state}, {"best", &best}, {"ema", &ema}})
      .restore(path);
  const std::string log = capture.text();
  CHECK(steps2 == 3);
  CHECK(state.best == 2.0);
  CHECK(best == 9.0);
  CHECK(ema == 0.5f);
  CHECK_THAT(log, Contains("user state \"early\" is not in the checkpoint") &&
                      Contains("counter \"best\" is not in the checkpoint") &&
                      Contains("counter \"ema\" is not in the checkpoint"));
}

TEST_CASE("A Metric subclass written by the program resumes exactly through a checkpoint",
          "[cpu][checkpoint][metrics]") {
  TempDir dir;
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  const std::vector<std::vector<float>> batches = {
      {1, -2, 3, 4}, {0.5f, -1, 2, 8}, {-3, 1, 1, 2}, {6, -5, 0.25f, 1}};
  const td::Tensor weights = td::Tensor::from_vector<float>({1, 2, 0.5f, 1});
  auto update = [&](WeightedRms& rms, size_t b) {
    const td::Tensor values = td::Tensor::from_vector(batches[b]);
    strategy.run([&](td::ReplicaContext& ctx) {
      const int64_t half = 2 * ctx.replica_id_in_sync_group();
      rms.update_state(values.slice(half, half + 2), weights.slice(half, half + 2));
    });
  };
  WeightedRms straight;
  for (size_t b = 0; b < batches.size(); ++b) update(straight, b);

  {
    WeightedRms first;
    update(first, 0);
    update(first, 1);
    td::Checkpoint({{"rms", &first}}).write(dir.file("ckpt-2.h5"));
  }
  WeightedRms resumed;
  td::Checkpoint({{"rms", &resumed}}).restore(dir.file("ckpt-2.h5"));
  update(resumed, 2);
  update(resumed, 3);
  CHECK(resumed.result() == straight.result());  // every partial sum is exact here
  CHECK(resumed.combined_state().at("per_bucket") == std::vector<double>{4, 12});
  CHECK(straight.result() == Approx(std::sqrt((1 + 8 + 4.5 + 16 + 0.25 + 2 + 2 + 64 + 9 + 2 + 0.5 +
                                               4 + 36 + 50 + 0.03125 + 1) /
                                              (4 * 4.5))));
  // The file holds the program's variables under its metric's name.
  td::h5::File file = td::h5::File::open(dir.file("ckpt-2.h5"));
  CHECK(file.root().open_group("training_state/metrics/rms").dataset_shape("per_bucket") ==
        td::Shape{2});
}
