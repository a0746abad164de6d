// Variables synchronized on read (tf.VariableSynchronization.ON_READ): each replica updates its
// own copy inside strategy.run; outside it (cross-replica context) a read gives the copies'
// aggregate (sum, mean or replica 0's), an assignment reaches every copy (a kSum one divided
// among them), a checkpoint saves the aggregate and a restore gives it back to every replica;
// trainable or unaggregated ones are refused where TensorFlow refuses them.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;

namespace {

/// Each replica r sets its copy to (r + 1) x [1, 2, 3].
void set_per_replica(td::Strategy& strategy, const td::Variable& v) {
  strategy.run([&](td::ReplicaContext& ctx) {
    const auto r = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    v.assign(td::Tensor::from_vector(std::vector<float>{r, 2 * r, 3 * r}));
  });
}

/// A layer holding one non-trainable statistic synchronized on read.
class StatImpl : public td::nn::ModuleImpl {
 public:
  explicit StatImpl(td::VariableAggregation aggregation)
      : ModuleImpl("stat"), aggregation_(aggregation) {}
  std::string type_name() const override { return "Stat"; }
  td::Variable stat;

 protected:
  void build_variables(const td::Shape&, td::Generator&) override {
    stat = add_weight("moving_mean", td::Tensor::zeros({3}),
                      td::VariableOptions{.trainable = false,
                                          .synchronization = td::VariableSynchronization::kOnRead,
                                          .aggregation = aggregation_});
  }
  td::Shape compute_output_shape(const td::Shape& input_shape) const override {
    return input_shape;
  }
  td::Tensor call(const td::Tensor& x, bool) override { return x; }

 private:
  td::VariableAggregation aggregation_;
};

}  // namespace

TEST_CASE("sync-on-read variables: each replica keeps its copy, a read outside run aggregates",
          "[cpu][distribute][sync_on_read]") {
  for (int replicas : {2, 4}) {
    auto strategy = td::MirroredStrategy::cpu(replicas);
    td::Variable sum, mean, first, mirrored;
    {
      auto scope = strategy.scope();
      auto make = [](const char* name, td::VariableAggregation aggregation) {
        return td::make_variable(name, td::Tensor::zeros({3}),
                                 {.trainable = false,
                                  .synchronization = td::VariableSynchronization::kOnRead,
                                  .aggregation = aggregation});
      };
      sum = make("sum", td::VariableAggregation::kSum);
      mean = make("mean", td::VariableAggregation::kMean);
      first = make("first", td::VariableAggregation::kOnlyFirstReplica);
      mirrored = td::make_variable("mirrored", td::Tensor::zeros({3}), false);
    }
    CHECK(sum.synchronization() == td::VariableSynchronization::kOnRead);
    CHECK(mirrored.synchronization() == td::VariableSynchronization::kOnWrite);
    for (const td::Variable& v : {sum, mean, first}) set_per_replica(strategy, v);
    INFO(replicas << " replicas");
    // Inside run each replica still sees its own copy.
    std::vector<float> seen(static_cast<size_t>(replicas));
    strategy.run([&](td::ReplicaContext& ctx) {
      seen[static_cast<size_t>(ctx.replica_id_in_sync_group())] =
          mean.value().to_vector<float>()[0];
    });
    for (int r = 0; r < replicas; ++r) CHECK(seen[static_cast<size_t>(r)] == r + 1.0f);
    const float total = static_cast<float>(replicas * (replicas + 1) / 2);
    CHECK(sum.value().to_vector<float>() == std::vector<float>{total, 2 * total, 3 * total});
    const float average = total / static_cast<float>(replicas);
    CHECK(mean.value().to_vector<float>() ==
          std::vector<float>{average, 2 * total / static_cast<float>(replicas),
                             3 * total / static_cast<float>(replicas)});
    CHECK(first.value().to_vector<float>() == std::vector<float>{1, 2, 3});
    // Assigning outside run reaches every copy; a sum's copies share the value.
    sum.assign(td::Tensor::from_vector(std::vector<float>{4, 8, 12}));
    mean.assign(td::Tensor::from_vector(std::vector<float>{5, 6, 7}));
    for (int r = 0; r < replicas; ++r) {
      CHECK(sum.copy(r).to_vector<float>() ==
            std::vector<float>{4.0f / replicas, 8.0f / replicas, 12.0f / replicas});
      CHECK(mean.copy(r).to_vector<float>() == std::vector<float>{5, 6, 7});
    }
    CHECK(sum.value().to_vector<float>() == std::vector<float>{4, 8, 12});
  }
}

TEST_CASE("strategy.reduce of a variable reduces its copies, as of a PerReplica",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(3);
  td::Variable statistic, weight;
  {
    auto scope = strategy.scope();
    statistic = td::make_variable("statistic", td::Tensor::zeros({2}),
                                  {.trainable = false,
                                   .synchronization = td::VariableSynchronization::kOnRead,
                                   .aggregation = td::VariableAggregation::kMean});
    weight = td::make_variable("weight", td::Tensor::from_vector(std::vector<float>{1, -2}));
  }
  strategy.run([&](td::ReplicaContext& ctx) {
    const auto r = static_cast<float>(ctx.replica_id_in_sync_group());
    statistic.assign(td::Tensor::from_vector(std::vector<float>{r, 10 * r}));
  });
  CHECK(strategy.reduce(td::ReduceOp::kMean, statistic).to_vector<float>() ==
        std::vector<float>{1, 10});
  CHECK(strategy.reduce(td::ReduceOp::kMean, statistic).to_vector<float>() ==
        statistic.aggregated().to_vector<float>());
  CHECK(strategy.reduce(td::ReduceOp::kSum, statistic).to_vector<float>() ==
        std::vector<float>{3, 30});
  CHECK(strategy.reduce(td::ReduceOp::kMax, statistic, 0).to_vector<float>() ==
        std::vector<float>{20});
  // A mirrored variable: every copy is the value, so the sum is 3 times it.
  CHECK(strategy.reduce(td::ReduceOp::kSum, weight).to_vector<float>() ==
        std::vector<float>{3, -6});
  CHECK(strategy.reduce(td::ReduceOp::kMean, weight).to_vector<float>() ==
        std::vector<float>{1, -2});
  // Made outside the scope: one copy, a non-distributed value.
  const td::Variable plain("plain", td::Tensor::from_vector(std::vector<float>{4}));
  CHECK(strategy.reduce(td::ReduceOp::kMean, plain).to_vector<float>() == std::vector<float>{4});
  REQUIRE_THROWS_WITH(strategy.reduce(td::ReduceOp::kSum, plain),
                      Catch::Contains("not a PerReplica"));
  auto other = td::MirroredStrategy::cpu(2);
  REQUIRE_THROWS_WITH(other.reduce(td::ReduceOp::kMean, weight),
                      Catch::Contains("\"weight\" has 3 copies") && Catch::Contains("2 replicas"));
}

TEST_CASE("sync-on-read variables: refused when trainable, unreadable without an aggregation",
          "[cpu][distribute][sync_on_read]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  auto scope = strategy.scope();
  CHECK_THROWS_WITH(
      td::make_variable(
          "w", td::Tensor::zeros({2}),
          {.trainable = true, .synchronization = td::VariableSynchronization::kOnRead}),
      Catch::Contains("variable \"w\": a trainable variable cannot be synchronized on read"));
  const td::Variable none = td::make_variable(
      "none", td::Tensor::zeros({2}),
      {.trainable = false, .synchronization = td::VariableSynchronization::kOnRead});
  CHECK_THROWS_WITH(none.value(), Catch::Contains("variable \"none\" is synchronized on read with "
                                                  "aggregation none"));
}

TEST_CASE("sync-on-read variables: a checkpoint saves the aggregate and restores it everywhere",
          "[cpu][distribute][sync_on_read]") {
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_sync_on_read_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "ckpt.h5").string();
  for (td::VariableAggregation aggregation :
       {td::VariableAggregation::kMean, td::VariableAggregation::kSum}) {
    INFO(td::to_string(aggregation));
    auto strategy = td::MirroredStrategy::cpu(2);
    td::nn::Module layer(std::make_shared<StatImpl>(aggregation));
    {
      auto scope = strategy.scope();
      layer.build({3});
    }
    auto& impl = static_cast<StatImpl&>(*layer.ptr());
    set_per_replica(strategy, impl.stat);  // copies [1, 2, 3] and [2, 4, 6]
    const std::vector<float> aggregate = impl.stat.value().to_vector<float>();
    CHECK(aggregate == (aggregation == td::VariableAggregation::kMean
                            ? std::vector<float>{1.5f, 3, 4.5f}
                            : std::vector<float>{3, 6, 9}));
    td::Checkpoint({{"model", &layer}}).write(path);
    // The file holds the aggregate under Keras's name.
    td::nn::Module plain(std::make_shared<StatImpl>(aggregation));
    plain.build({3});
    td::Checkpoint({{"model", &plain}}).restore(path);
    CHECK(static_cast<StatImpl&>(*plain.ptr()).stat.value().to_vector<float>() == aggregate);
    // Restored into two replicas: each copy gets its share, the aggregate is the saved value.
    set_per_replica(strategy, impl.stat);
    td::Checkpoint({{"model", &layer}}).restore(path);
    CHECK(impl.stat.value().to_vector<float>() == aggregate);
    const std::vector<float> each = aggregation == td::VariableAggregation::kMean
                                        ? aggregate
                                        : std::vector<float>{1.5f, 3, 4.5f};
    CHECK(impl.stat.copy(0).to_vector<float>() == each);
    CHECK(impl.stat.copy(1).to_vector<float>() == each);
  }
  fs::remove_all(dir);
}
