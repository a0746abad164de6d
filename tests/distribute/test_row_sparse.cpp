// Row-sparse gradients (embedding tables) across replicas: summed by gathering the touched rows
// when that moves fewer bytes, by the dense all-reduce otherwise, with the dense all-reduce's
// result bit for bit either way; and an Embedding model trained on replicas ends with the same
// bits whichever route its gradients took.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;

namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Replica r's gradient [rows, 6]: `touched` rows chosen from its own seed (some rows shared by
/// several replicas, as batches share frequent tokens), random values; row 0 holds -0 on every
/// replica and row 1 -0 on replica 0 only, the two cases where adding +0 matters.
template <typename T>
td::Tensor replica_gradient(int replica, int64_t rows, int64_t touched) {
  std::vector<T> g(static_cast<size_t>(rows * 6), T(0));
  td::Generator generator(/*seed=*/100 + static_cast<uint64_t>(replica));
  const std::vector<float> draws =
      td::Tensor::uniform({touched, 7}, generator, 0.0, 1.0).to_vector<float>();
  for (int64_t k = 0; k < touched; ++k) {
    // Half the rows from a small shared range, half from the whole table.
    const float pick = draws[static_cast<size_t>(k * 7)];
    const int64_t row = 2 + static_cast<int64_t>(pick * static_cast<float>(k % 2 ? rows - 2 : 8));
    for (int64_t c = 0; c < 6; ++c)
      g[static_cast<size_t>(row * 6 + c)] =
          static_cast<T>(draws[static_cast<size_t>(k * 7 + 1 + c)] * 2.0f - 1.0f) / T(3);
  }
  for (int64_t c = 0; c < 6; ++c) g[static_cast<size_t>(c)] = T(-0.0);
  if (replica == 0)
    for (int64_t c = 0; c < 6; ++c) g[static_cast<size_t>(6 + c)] = T(-0.0);
  // Called on the replica threads, where Catch's assertions must not run: the caller checks.
  return td::Tensor::from_vector(g, td::Shape{rows, 6});
}

template <typename T>
void check_routes(int replicas, td::DType dtype) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  struct Case {
    int64_t rows, touched;
    bool gathered;
  };
  // 4000 rows, 5 touched per replica: gathering moves far less; 40 rows all touched: dense.
  for (const Case c : {Case{4000, 5, true}, Case{40, 60, false}}) {
    INFO(replicas << " replicas, " << c.rows << " rows, " << c.touched << " touched per replica");
    std::vector<std::vector<T>> dense(static_cast<size_t>(replicas)),
        routed(static_cast<size_t>(replicas));
    std::vector<td::ReplicaContext::RowSparseCounts> counts(static_cast<size_t>(replicas));
    strategy.run([&](td::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const td::ReplicaContext::RowSparseCounts before = ctx.row_sparse_counts();
      const td::Tensor g = replica_gradient<T>(r, c.rows, c.touched);
      dense[static_cast<size_t>(r)] = ctx.all_reduce(td::ReduceOp::kSum, g).template to_vector<T>();
      td::optim::GradientSync& sync = ctx;
      routed[static_cast<size_t>(r)] =
          sync.sum_across_replicas({g}, {true})[0].template to_vector<T>();
      const td::ReplicaContext::RowSparseCounts after = ctx.row_sparse_counts();
      counts[static_cast<size_t>(r)] = {after.gathered - before.gathered,
                                        after.dense - before.dense};
    });
    REQUIRE(replica_gradient<T>(0, c.rows, c.touched).dtype() == dtype);
    for (size_t r = 0; r < dense.size(); ++r) {
      INFO("replica " << r);
      CHECK(same_bits(routed[r], dense[r]));
      CHECK(counts[r].gathered == (c.gathered ? 1u : 0u));
      CHECK(counts[r].dense == (c.gathered ? 0u : 1u));
    }
    // The -0 cases: every replica's -0 sums to -0; replica 0's alone to +0.
    CHECK(std::signbit(routed[0][0]));
    CHECK_FALSE(std::signbit(routed[0][6]));
  }
}

struct Trained {
  std::vector<float> initial_table;
  std::vector<std::vector<float>> weights;
  td::ReplicaContext::RowSparseCounts counts;
};

/// 12 Adam steps of Embedding(500, 8) -> Flatten -> Dense(3) on `replicas` CPU replicas, each
/// replica's batch 4 sequences of 5 tokens; `row_sparse` false turns the table's hint off.
Trained train_embedding(int replicas, bool row_sparse) {
  constexpr int64_t kVocabulary = 500, kTokens = 5, kPerReplica = 4;
  auto strategy = td::MirroredStrategy::cpu(replicas);
  nn::Sequential model({nn::Embedding(kVocabulary, 8), nn::Flatten(), nn::Dense(3)});
  std::unique_ptr<td::optim::Adam> adam;
  {
    auto scope = strategy.scope();
    model.set_seed(3);
    model.build({kTokens});
    adam = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 0.01});
  }
  REQUIRE(model.weights()[0].row_sparse_gradient());  // Embedding's table
  model.weights()[0].set_row_sparse_gradient(row_sparse);
  const std::vector<td::Variable> variables = model.trainable_variables();
  const int64_t global = kPerReplica * replicas;
  Trained out;
  out.initial_table = model.weights()[0].value().to_vector<float>();
  for (int step = 0; step < 12; ++step) {
    std::vector<td::Tensor> xs, ys;
    for (int r = 0; r < replicas; ++r) {
      std::vector<int64_t> tokens, labels;
      for (int64_t i = 0; i < kPerReplica * kTokens; ++i)
        tokens.push_back((step * 131 + r * 37 + i * i * 7) % kVocabulary);
      for (int64_t i = 0; i < kPerReplica; ++i) labels.push_back((step + r + i) % 3);
      xs.push_back(td::Tensor::from_vector(tokens, td::Shape{kPerReplica, kTokens}));
      ys.push_back(td::Tensor::from_vector(labels));
    }
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
          td::GradientTape tape;
          const td::Tensor loss = td::compute_average_loss(
              td::losses::sparse_categorical_crossentropy(y, model(x, true), true), global);
          adam->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          if (ctx.replica_id_in_sync_group() == 0) out.counts = ctx.row_sparse_counts();
        },
        td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
  }
  for (const td::Variable& v : model.weights()) out.weights.push_back(v.value().to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("row-sparse gradients: gathered rows or the dense all-reduce, the same bits",
          "[cpu][distribute][row_sparse]") {
  for (const int replicas : {2, 4}) {
    check_routes<float>(replicas, td::DType::kFloat32);
    check_routes<double>(replicas, td::DType::kFloat64);
  }
}

TEST_CASE("an Embedding model trains to the same bits whether its table's gradient is gathered",
          "[cpu][distribute][row_sparse]") {
  for (const int replicas : {2, 3}) {
    INFO(replicas << " replicas");
    const Trained gathered = train_embedding(replicas, /*row_sparse=*/true);
    const Trained dense = train_embedding(replicas, /*row_sparse=*/false);
    CHECK(gathered.counts.gathered == 12);
    CHECK(dense.counts.gathered == 0);
    REQUIRE(gathered.weights.size() == dense.weights.size());
    for (size_t v = 0; v < dense.weights.size(); ++v) {
      INFO("variable " << v);
      CHECK(same_bits(gathered.weights[v], dense.weights[v]));
    }
    // The table did train.
    CHECK_FALSE(same_bits(gathered.weights[0], gathered.initial_table));
  }
}
