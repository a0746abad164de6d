// Strategies on CPU replicas: construction and threads, run and PerReplica, mirrored variables,
// ReplicaContext collectives and merge_call, reduce/gather semantics, loss scaling, and the
// error paths (exception in a replica, mismatched collectives, variable outside the scope).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "support/scoped_timeout.h"
#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"

namespace td = tandem;
using td::testing::ScopedTimeout;

namespace {

// Catch2 v2 assertions are not thread safe: replica functions record what they see and the
// test thread checks it.

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

td::Tensor vec(std::vector<float> values) { return td::Tensor::from_vector(values); }

}  // namespace

// ---- construction -----------------------------------------------------------------------------

TEST_CASE("MirroredStrategy keeps one persistent thread per replica", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(3);
  REQUIRE(strategy.num_replicas_in_sync() == 3);
  REQUIRE(strategy.name() == "MirroredStrategy");
  REQUIRE(strategy.is_chief());
  std::vector<std::thread::id> first(3), second(3);
  auto where = [&](std::vector<std::thread::id>& into) {
    td::PerReplica<bool> consistent = strategy.run([&](td::ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      into[static_cast<size_t>(id)] = std::this_thread::get_id();
      const td::ReplicaBinding binding = td::current_replica_binding();
      return ctx.num_replicas_in_sync() == 3 && ctx.device() == td::Device::cpu(id) &&
             td::current_replica_context() == &ctx && binding.replica_id == id &&
             binding.num_replicas == 3 &&
             td::compute_threads() == std::max(1, td::hardware_cores() / 3);
    });
    for (bool ok : consistent.values()) REQUIRE(ok);
  };
  where(first);
  where(second);
  REQUIRE(first == second);
  REQUIRE(std::set<std::thread::id>(first.begin(), first.end()).size() == 3);
  REQUIRE(std::find(first.begin(), first.end(), std::this_thread::get_id()) == first.end());
  REQUIRE(td::in_cross_replica_context());
}

TEST_CASE("a CPU replica keeps the compute-thread count its task sets", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  // Replica 0 asks for one thread, replica 1 leaves its share.
  strategy.run([](td::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) td::set_compute_threads(1);
  });
  for (int run = 0; run < 3; ++run) {
    const td::PerReplica<int> threads =
        strategy.run([](td::ReplicaContext&) { return td::compute_threads(); });
    CHECK(threads.values()[0] == 1);
    // At most its share: fewer while other processes keep cores busy (free_cores).
    CHECK(threads.values()[1] >= 1);
    CHECK(threads.values()[1] <= std::max(1, td::hardware_cores() / 2));
  }
}

TEST_CASE("strategies from device lists, the environment and the defaults", "[cpu][distribute]") {
  td::MirroredStrategy listed({"cpu:0", "cpu:1"});
  REQUIRE(listed.num_replicas_in_sync() == 2);
  REQUIRE(listed.devices()[1] == td::Device::cpu(1));
  // A GPU that is not there is refused by name (without CUDA built: NotBuiltError).
  REQUIRE_THROWS_WITH(td::MirroredStrategy({"cuda:99"}), Catch::Contains("cuda:99"));
  if (!td::cuda_availability().built)
    REQUIRE_THROWS_AS(td::MirroredStrategy({"cuda:0"}), td::NotBuiltError);
  if (td::cuda_device_count() == 0) {
    REQUIRE_THROWS_WITH(td::MirroredStrategy({"cuda:0"}), Catch::Contains("cuda:0"));
  } else {
    REQUIRE(td::MirroredStrategy({"cuda:0"}).devices()[0] == td::Device::cuda(0));
    REQUIRE_THROWS_WITH(td::MirroredStrategy({"cpu:0", "cuda:0"}),
                        Catch::Contains("mixes CPU and GPU replicas"));
  }
  REQUIRE_THROWS_WITH(td::MirroredStrategy::cpu(0), Catch::Contains("at least one replica"));

  ::setenv("TANDEM_CPU_REPLICAS", "3", 1);
  {
    td::MirroredStrategy from_env;
    REQUIRE(from_env.num_replicas_in_sync() == 3);
  }
  ::setenv("TANDEM_CPU_REPLICAS", "two", 1);
  REQUIRE_THROWS_WITH(td::MirroredStrategy(), Catch::Contains("TANDEM_CPU_REPLICAS=\"two\""));
  ::unsetenv("TANDEM_CPU_REPLICAS");
  td::MirroredStrategy plain;  // every GPU, else one CPU replica
  REQUIRE(plain.num_replicas_in_sync() == std::max(1, td::cuda_device_count()));

  td::OneDeviceStrategy one("cpu");
  REQUIRE(one.num_replicas_in_sync() == 1);
  REQUIRE(td::default_strategy().num_replicas_in_sync() == 1);
  REQUIRE(td::default_strategy().name() == "DefaultStrategy");
}

TEST_CASE("one-replica strategies run on the calling thread with no-op collectives",
          "[cpu][distribute]") {
  td::OneDeviceStrategy one(td::Device::cpu());
  for (td::Strategy* strategy : {static_cast<td::Strategy*>(&one), &td::default_strategy()}) {
    const td::Tensor x = vec({1, 2, 3});
    const std::thread::id caller = std::this_thread::get_id();
    td::PerReplica<td::Tensor> out = strategy->run([&](td::ReplicaContext& ctx) {
      REQUIRE(std::this_thread::get_id() == caller);  // inline: assertions are safe here
      REQUIRE(ctx.replica_id_in_sync_group() == 0);
      td::Tensor summed = ctx.all_reduce(td::ReduceOp::kSum, x);
      REQUIRE(summed.shares_storage_with(x));  // one replica: the value itself
      REQUIRE(ctx.all_gather(x).shares_storage_with(x));
      return summed;
    });
    REQUIRE(out.size() == 1);
    REQUIRE(strategy->reduce(td::ReduceOp::kSum, out).to_vector<float>() ==
            std::vector<float>{1, 2, 3});
    REQUIRE(strategy->reduce(td::ReduceOp::kSum, x).to_vector<float>() ==
            std::vector<float>{1, 2, 3});
  }
  // The default strategy's scope changes nothing.
  auto scope = td::default_strategy().scope();
  td::Variable v = td::make_variable("v", vec({1}));
  REQUIRE(v.num_copies() == 1);
}

// ---- run and PerReplica -------------------------------------------------------------------------

TEST_CASE("run unpacks PerReplica arguments and shares the others", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  const td::PerReplica<int> ids(std::vector<int>{10, 20});
  const std::string shared = "shared";
  td::PerReplica<int> out = strategy.run(
      [&](td::ReplicaContext& ctx, const int& mine, const std::string& text) {
        // The shared argument arrives by const reference, not copied.
        return &text == &shared ? mine + ctx.replica_id_in_sync_group() : -1;
      },
      ids, shared);
  REQUIRE(strategy.local_results(out) == std::vector<int>{10, 21});
  REQUIRE(out[1] == 21);

  std::atomic<int> calls{0};
  strategy.run([&](td::ReplicaContext&) { ++calls; });  // void
  REQUIRE(calls == 2);

  const td::PerReplica<int> wrong(std::vector<int>{1, 2, 3});
  REQUIRE_THROWS_WITH(strategy.run([](td::ReplicaContext&, int) {}, wrong),
                      Catch::Contains("holds 3 values but the strategy has 2 replicas"));
}

TEST_CASE("strategy.run cannot nest", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  REQUIRE_THROWS_WITH(
      strategy.run([&](td::ReplicaContext&) { strategy.run([](td::ReplicaContext&) {}); }),
      Catch::Contains("cannot nest"));
  REQUIRE_THROWS_WITH(strategy.run([&](td::ReplicaContext& ctx) {
    ctx.merge_call([&](td::Strategy& s) { s.run([](td::ReplicaContext&) {}); });
  }),
                      Catch::Contains("cannot nest"));
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("an exception in replica 1 is re-raised with its id, peers released",
          "[cpu][distribute]") {
  ScopedTimeout timeout(std::chrono::seconds(60));  // release must not come from the timeout
  auto strategy = td::MirroredStrategy::cpu(3);
  const auto start = std::chrono::steady_clock::now();
  try {
    strategy.run([&](td::ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) throw std::runtime_error("bad batch 17");
      ctx.all_reduce(td::ReduceOp::kSum, vec({1}));  // replicas 0 and 2 block here
    });
    FAIL("run did not raise");
  } catch (const td::Error& e) {
    const std::string message = e.what();
    INFO(message);
    REQUIRE_THAT(message, Catch::StartsWith("replica 1: bad batch 17"));
    REQUIRE_THAT(message, Catch::Contains("replicas 0, 2 were released"));
  }
  REQUIRE(seconds_since(start) < 5.0);

  // The strategy is still usable, and its collectives start clean.
  td::PerReplica<td::Tensor> sums = strategy.run([&](td::ReplicaContext& ctx) {
    return ctx.all_reduce(td::ReduceOp::kSum,
                          vec({static_cast<float>(ctx.replica_id_in_sync_group())}));
  });
  for (const td::Tensor& s : sums.values()) REQUIRE(s.item<float>() == 3.0f);

  // tandem errors keep their text; a non-std exception is still reported.
  REQUIRE_THROWS_WITH(strategy.run([](td::ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 2) throw 42;
  }),
                      Catch::StartsWith("replica 2: an exception of unknown type"));
}

TEST_CASE("a replica that skips a collective fails the run on every replica", "[cpu][distribute]") {
  ScopedTimeout timeout(std::chrono::seconds(2));
  auto strategy = td::MirroredStrategy::cpu(2);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(
      strategy.run([&](td::ReplicaContext& ctx) {
        ctx.all_reduce(td::ReduceOp::kSum, vec({1}));
        if (ctx.replica_id_in_sync_group() == 0) ctx.all_reduce(td::ReduceOp::kSum, vec({2}));
      }),
      Catch::StartsWith("replica 0: all_reduce #2: replica 1 returned from the replica function "
                        "after 1 collective call"));
  REQUIRE(seconds_since(start) < 2.0);

  // A replica stuck elsewhere (not returned, not calling) ends in the timeout on the others.
  std::atomic<bool> release{false};
  const auto waited = std::chrono::steady_clock::now();
  try {
    strategy.run([&](td::ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      try {
        ctx.all_reduce(td::ReduceOp::kSum, vec({1}));
      } catch (...) {
        release = true;
        throw;
      }
    });
    FAIL("run did not raise");
  } catch (const td::TimeoutError& e) {
    REQUIRE_THAT(e.what(), Catch::StartsWith("replica 0: all_reduce #1 timed out after 2 s: "
                                             "replica 1 did not arrive"));
  }
  REQUIRE(seconds_since(waited) < 4.0);

  // Same call number, different shapes: both replicas raise the mismatch.
  REQUIRE_THROWS_WITH(strategy.run([&](td::ReplicaContext& ctx) {
    const int64_t n = ctx.replica_id_in_sync_group() == 0 ? 3 : 4;
    ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({n}));
  }),
                      Catch::Contains("do not match"));
}

// ---- variables ----------------------------------------------------------------------------------

TEST_CASE("variables created in scope are mirrored, outside it they are refused",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  td::Variable mirrored;
  {
    auto scope = strategy.scope();
    mirrored = td::make_variable("w", vec({1, 2}));
  }
  REQUIRE(mirrored.num_copies() == 2);
  REQUIRE_FALSE(mirrored.copy(0).shares_storage_with(mirrored.copy(1)));
  REQUIRE(mirrored.copy(1).to_vector<float>() == std::vector<float>{1, 2});
  td::PerReplica<bool> reads_own = strategy.run([&](td::ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    mirrored.assign(vec({static_cast<float>(id), 0}));  // each replica writes its own copy
    return mirrored.value().shares_storage_with(mirrored.copy(id));
  });
  REQUIRE(reads_own[0]);
  REQUIRE(reads_own[1]);
  REQUIRE(mirrored.copy(1).to_vector<float>() == std::vector<float>{1, 0});

  // Created inside run (e.g. a model built on first use): mirrored as well.
  td::PerReplica<td::Variable> made =
      strategy.run([](td::ReplicaContext&) { return td::make_variable("lazy", vec({5})); });
  REQUIRE(made[0].num_copies() == 2);

  const td::Variable outside = td::make_variable("outside", vec({1}));
  REQUIRE(outside.num_copies() == 1);
  REQUIRE_THROWS_WITH(strategy.run([&](td::ReplicaContext&) { (void)outside.value(); }),
                      Catch::Contains("was created outside strategy.scope()") &&
                          Catch::Contains("strategy.run of 2 replicas"));

  auto other = td::MirroredStrategy::cpu(2);
  auto scope = strategy.scope();
  REQUIRE_THROWS_WITH(other.scope(), Catch::Contains("already inside the scope of another"));
}

// ---- ReplicaContext -----------------------------------------------------------------------------

TEST_CASE("ctx.all_reduce of a list is one batched call and returns new tensors",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  const uint64_t before = td::detail::StrategyAccess::communicator(strategy, 0).stats().all_reduce;
  td::PerReplica<std::vector<td::Tensor>> out = strategy.run([&](td::ReplicaContext& ctx) {
    const float r = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    std::vector<td::Tensor> in{vec({r, 2 * r}), td::Tensor(), vec({10 * r})};
    std::vector<td::Tensor> reduced = ctx.all_reduce(td::ReduceOp::kMean, in);
    reduced.push_back(in[0]);  // to check the input was left untouched
    return reduced;
  });
  REQUIRE_FALSE(out[0][1].defined());
  REQUIRE(out[1][3].to_vector<float>() == std::vector<float>{2, 4});
  REQUIRE(td::detail::StrategyAccess::communicator(strategy, 0).stats().all_reduce == before + 1);
  REQUIRE(out[1][0].to_vector<float>() == std::vector<float>{1.5f, 3.0f});
  REQUIRE(out[0][2].item<float>() == 15.0f);
}

TEST_CASE("replica-context collectives allocate nothing from the system in steady state",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  const td::PerReplica<std::vector<td::Tensor>> grads(
      std::vector<std::vector<td::Tensor>>{{td::Tensor::ones({256, 64}), td::Tensor::ones({64})},
                                           {td::Tensor::ones({256, 64}), td::Tensor::ones({64})}});
  auto step = [&] {
    strategy.run(
        [](td::ReplicaContext& ctx, const std::vector<td::Tensor>& g) {
          const std::vector<td::Tensor> summed = ctx.all_reduce(td::ReduceOp::kSum, g);
          ctx.broadcast(summed[1], 0);
        },
        grads);
  };
  step();
  const uint64_t before = td::cpu_allocator().stats().system_allocs;
  for (int i = 0; i < 20; ++i) step();
  REQUIRE(td::cpu_allocator().stats().system_allocs == before);
}

TEST_CASE("ctx.all_gather concatenates uneven pieces and ctx.broadcast copies the root",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  const td::PerReplica<td::Tensor> pieces(
      std::vector<td::Tensor>{td::Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}),
                              td::Tensor::from_vector<float>({8, 9, 10, 11}, {2, 2})});
  td::PerReplica<td::Tensor> gathered = strategy.run(
      [](td::ReplicaContext& ctx, const td::Tensor& x) { return ctx.all_gather(x, 0); }, pieces);
  for (const td::Tensor& g : gathered.values()) {
    REQUIRE(g.shape() == td::Shape{6, 2});
    REQUIRE(g.to_vector<float>()[11] == 11.0f);
  }
  td::PerReplica<td::Tensor> columns = strategy.run([](td::ReplicaContext& ctx) {
    const float r = static_cast<float>(ctx.replica_id_in_sync_group());
    return ctx.all_gather(td::Tensor::full({2, 1 + ctx.replica_id_in_sync_group()}, r), 1);
  });
  REQUIRE(columns[0].shape() == td::Shape{2, 3});
  REQUIRE(columns[0].to_vector<float>() == std::vector<float>{0, 1, 1, 0, 1, 1});
  td::PerReplica<td::Tensor> root = strategy.run([](td::ReplicaContext& ctx) {
    return ctx.broadcast(vec({static_cast<float>(ctx.replica_id_in_sync_group() + 7)}), 1);
  });
  REQUIRE(root[0].item<float>() == 8.0f);
  REQUIRE(root[1].item<float>() == 8.0f);
}

TEST_CASE("merge_call runs once, on replica 0, in cross-replica context", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(3);
  std::atomic<int> calls{0};
  std::thread::id merge_thread;
  const td::Strategy* seen_strategy = nullptr;
  bool cross_replica = false;
  int binding_replicas = 0;
  td::PerReplica<std::thread::id> replica_threads =
      strategy.run([](td::ReplicaContext&) { return std::this_thread::get_id(); });
  td::PerReplica<int> out = strategy.run([&](td::ReplicaContext& ctx) {
    const int mine = 10 * (ctx.replica_id_in_sync_group() + 1);
    return ctx.merge_call(
        [&](td::Strategy& s, const td::PerReplica<int>& values) {
          ++calls;
          merge_thread = std::this_thread::get_id();
          seen_strategy = &s;
          cross_replica = td::in_cross_replica_context();
          binding_replicas = td::current_replica_binding().num_replicas;
          return values[0] + values[1] + values[2];
        },
        mine);
  });
  REQUIRE(calls == 1);
  REQUIRE(merge_thread == replica_threads[0]);
  REQUIRE(seen_strategy == &strategy);
  REQUIRE(cross_replica);
  REQUIRE(binding_replicas == 1);
  REQUIRE(strategy.local_results(out) == std::vector<int>{60, 60, 60});

  // void merge functions, and an exception in one, which every replica sees.
  strategy.run([&](td::ReplicaContext& ctx) { ctx.merge_call([&](td::Strategy&) { ++calls; }); });
  REQUIRE(calls == 2);
  REQUIRE_THROWS_WITH(strategy.run([](td::ReplicaContext& ctx) {
    ctx.merge_call([](td::Strategy&) -> int { throw td::Error("merge failed"); });
  }),
                      Catch::StartsWith("replica 0: merge failed") &&
                          Catch::Contains("replicas 1, 2 were released"));
}

// ---- reduce and gather -------------------------------------------------------------------------

TEST_CASE("strategy.reduce element-wise: SUM, MEAN, MAX", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  td::PerReplica<td::Tensor> values = strategy.run([](td::ReplicaContext& ctx) {
    const float r = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    return vec({r, 2 * r});
  });
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, values).to_vector<float>() ==
          std::vector<float>{3, 6});
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, values).to_vector<float>() ==
          std::vector<float>{1.5f, 3});
  REQUIRE(strategy.reduce(td::ReduceOp::kMax, values).to_vector<float>() ==
          std::vector<float>{2, 4});
  td::PerReplica<td::Tensor> scalars = strategy.run([](td::ReplicaContext& ctx) {
    return td::Tensor::scalar(ctx.replica_id_in_sync_group() + 0.25);
  });
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, scalars).item<float>() == 1.5f);

  const td::PerReplica<td::Tensor> uneven(std::vector<td::Tensor>{vec({1, 2}), vec({3})});
  REQUIRE_THROWS_WITH(strategy.reduce(td::ReduceOp::kSum, uneven), Catch::Contains("axis"));
  REQUIRE_THROWS_WITH(
      strategy.run([&](td::ReplicaContext&) { strategy.reduce(td::ReduceOp::kSum, values); }),
      Catch::Contains("cross-replica call"));
}

TEST_CASE("strategy.reduce with an axis divides MEAN by the total count (4/2 split -> 6)",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  // A 6-example batch split 4/2, per-example losses 1..6.
  const td::PerReplica<td::Tensor> batch(std::vector<td::Tensor>{vec({1, 2, 3, 4}), vec({5, 6})});
  td::PerReplica<td::Tensor> losses =
      strategy.run([](td::ReplicaContext&, const td::Tensor& x) { return x; }, batch);
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, losses, 0).item<float>() == 3.5f);  // 21 / 6
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, losses, 0).item<float>() == 21.0f);
  REQUIRE(strategy.reduce(td::ReduceOp::kMax, losses, 0).item<float>() == 6.0f);
  // Not the mean of the replica means ((2.5 + 5.5) / 2 = 4).
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, losses, -1).item<float>() != 4.0f);

  // Rank 2 with an axis of unequal length; an empty replica counts nothing.
  const td::PerReplica<td::Tensor> rows(std::vector<td::Tensor>{
      td::Tensor::from_vector<float>({1, 10, 2, 20, 3, 30}, {3, 2}), td::Tensor::zeros({0, 2})});
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, rows, 0).to_vector<float>() ==
          std::vector<float>{2, 20});
  REQUIRE(strategy.gather(rows, 0).shape() == td::Shape{3, 2});
  REQUIRE(strategy.gather(batch, 0).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("SUM of a non-distributed value with more than one replica is rejected",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  const td::Tensor plain = vec({1, 3});
  REQUIRE_THROWS_WITH(strategy.reduce(td::ReduceOp::kSum, plain),
                      Catch::Contains("not a PerReplica") && Catch::Contains("2 times"));
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, plain).to_vector<float>() ==
          std::vector<float>{1, 3});
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, plain, 0).item<float>() == 2.0f);
  auto single = td::MirroredStrategy::cpu(1);
  REQUIRE(single.reduce(td::ReduceOp::kSum, plain, 0).item<float>() == 4.0f);
}

// ---- loss scaling ------------------------------------------------------------------------------

TEST_CASE("compute_average_loss divides by the global batch", "[cpu][distribute]") {
  const td::Tensor per_example = vec({1, 2, 3, 4});
  REQUIRE(td::compute_average_loss(per_example, 8).item<float>() == 1.25f);
  // sample_weight multiplies before the sum; the divisor stays the global batch.
  REQUIRE(td::compute_average_loss(per_example, 8, vec({1, 0, 1, 0})).item<float>() == 0.5f);
  REQUIRE(td::compute_average_loss(per_example, 0).item<float>() == 0.0f);
  REQUIRE(td::compute_average_loss(td::Tensor::zeros({0}), std::nullopt).item<float>() == 0.0f);
  // No global batch: this replica's batch x replicas (1 outside run).
  REQUIRE(td::compute_average_loss(per_example).item<float>() == 2.5f);
  auto strategy = td::MirroredStrategy::cpu(2);
  td::PerReplica<td::Tensor> losses = strategy.run([&](td::ReplicaContext&) {
    return td::compute_average_loss(per_example);  // 10 / (4 x 2)
  });
  REQUIRE(losses[1].item<float>() == 1.25f);
  td::PerReplica<td::Tensor> reg = strategy.run([](td::ReplicaContext&) {
    return td::scale_regularization_loss(vec({1, 2, 3}));  // 6 / 2
  });
  REQUIRE(reg[0].item<float>() == 3.0f);
  REQUIRE_THROWS_WITH(td::compute_average_loss(td::Tensor::scalar(1.0), 4),
                      Catch::Contains("must have a batch axis"));

  // Differentiable: d/dx sum(x * w) / 8 = w / 8.
  td::Tensor x = vec({1, 2, 3, 4});
  td::GradientTape tape;
  tape.watch(x);
  const td::Tensor loss = td::compute_average_loss(x, 8, vec({1, 2, 0, 0}));
  REQUIRE(tape.gradient(loss, x).to_vector<float>() == std::vector<float>{0.125f, 0.25f, 0, 0});
}

// ---- optimizer and metrics ---------------------------------------------------------------------

TEST_CASE("apply_gradients(ctx) sums gradients, clips after the sum, updates every copy",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  td::Variable w;
  std::unique_ptr<td::optim::SGD> sgd;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", vec({0, 0}));
    sgd = std::make_unique<td::optim::SGD>(
        td::optim::SGD::Options{.learning_rate = 1.0, .global_clipnorm = 5.0});
  }
  const uint64_t before = td::detail::StrategyAccess::communicator(strategy, 1).stats().all_reduce;
  // Replica gradients (3, 0) and (0, 4) sum to (3, 4), norm 5: unclipped. Clipping each
  // replica's own gradient first would not change them either, but their sum must be used.
  strategy.run([&](td::ReplicaContext& ctx) {
    const td::Tensor g = ctx.replica_id_in_sync_group() == 0 ? vec({3, 0}) : vec({0, 4});
    sgd->apply_gradients(ctx, {g}, {w});
  });
  REQUIRE(td::detail::StrategyAccess::communicator(strategy, 1).stats().all_reduce == before + 1);
  for (int r = 0; r < 2; ++r) REQUIRE(w.copy(r).to_vector<float>() == std::vector<float>{-3, -4});
  // (6, 8) on each replica sums to (12, 16), norm 20, clipped to norm 5: (3, 4). Clipping
  // before the sum would give (3, 4) + (3, 4) = (6, 8).
  strategy.run([&](td::ReplicaContext& ctx) { sgd->apply_gradients(ctx, {vec({6, 8})}, {w}); });
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> v = w.copy(r).to_vector<float>();
    REQUIRE(v[0] == Approx(-6.0f));
    REQUIRE(v[1] == Approx(-8.0f));
  }
  REQUIRE(sgd->iterations() == 2);
  td::PerReplica<int64_t> steps =
      strategy.run([&](td::ReplicaContext&) { return sgd->iterations(); });
  REQUIRE(strategy.local_results(steps) == std::vector<int64_t>{2, 2});
}

TEST_CASE("apply_gradients without ctx inside a run of several replicas raises, naming the fix",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  td::Variable w;
  std::unique_ptr<td::optim::SGD> sgd;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", vec({0, 0}));
    sgd = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 1.0});
  }
  // Each replica would update its copy with its own gradient alone: the copies would differ.
  CHECK_THROWS_WITH(strategy.run([&](td::ReplicaContext& ctx) {
    const td::Tensor g = ctx.replica_id_in_sync_group() == 0 ? vec({3, 0}) : vec({0, 4});
    sgd->apply_gradients({g}, {w});
  }),
                    Catch::Contains("sgd.apply_gradients(gradients, variables) was called inside "
                                    "strategy.run") &&
                        Catch::Contains("of 2 replicas without the replica context") &&
                        Catch::Contains("optimizer.apply_gradients(ctx, gradients, variables)"));
  for (int r = 0; r < 2; ++r) CHECK(w.copy(r).to_vector<float>() == std::vector<float>{0, 0});
  CHECK(sgd->iterations() == 0);
  // Gradients summed by hand, said so: the update of every copy, as with ctx.
  strategy.run([&](td::ReplicaContext& ctx) {
    const td::Tensor g = ctx.replica_id_in_sync_group() == 0 ? vec({3, 0}) : vec({0, 4});
    sgd->apply_gradients({ctx.all_reduce(td::ReduceOp::kSum, g)}, {w},
                         {.skip_gradients_aggregation = true});
  });
  for (int r = 0; r < 2; ++r) CHECK(w.copy(r).to_vector<float>() == std::vector<float>{-3, -4});
  // In cross-replica context (inside merge_call) the call is the user's own: it does not raise,
  // and updates every replica's copy alike (strategy.extended.update).
  CHECK_NOTHROW(strategy.run([&](td::ReplicaContext& ctx) {
    ctx.merge_call([&](td::Strategy&) { sgd->apply_gradients({vec({1, 1})}, {w}); });
  }));
  for (int r = 0; r < 2; ++r) {
    CHECK(w.copy(r).to_vector<float>() == std::vector<float>{-4, -5});
    CHECK(sgd->iterations_variable().copy(r).item<int64_t>() == 2);
  }
  // Inside the run of a one-replica strategy there is nothing to sum: it updates.
  td::OneDeviceStrategy one(td::Device::cpu());
  td::Variable v;
  td::optim::SGD plain(td::optim::SGD::Options{.learning_rate = 1.0});
  {
    auto scope = one.scope();
    v = td::make_variable("v", vec({0}));
  }
  one.run([&](td::ReplicaContext&) { plain.apply_gradients({vec({2})}, {v}); });
  CHECK(v.copy(0).to_vector<float>() == std::vector<float>{-2});
}

TEST_CASE("a sync-on-read metric equals the metric over the whole global batch",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  // 6 examples, split 4/2; predictions right for examples 0, 2, 3, 5.
  const td::Tensor labels = td::Tensor::from_vector<int64_t>({0, 1, 2, 0, 1, 2});
  const td::Tensor logits = td::Tensor::from_vector<float>(
      {5, 0, 0, /**/ 5, 0, 0, /**/ 0, 0, 5, /**/ 5, 0, 0, /**/ 0, 0, 5, /**/ 0, 0, 5}, {6, 3});
  td::metrics::SparseCategoricalAccuracy distributed;
  td::metrics::Mean distributed_loss;
  const td::PerReplica<td::Tensor> y(
      std::vector<td::Tensor>{labels.slice(0, 4), labels.slice(4, 6)});
  const td::PerReplica<td::Tensor> p(
      std::vector<td::Tensor>{logits.slice(0, 4), logits.slice(4, 6)});
  strategy.run(
      [&](td::ReplicaContext&, const td::Tensor& yt, const td::Tensor& yp) {
        distributed.update_state(yt, yp);
        distributed_loss.update_state(td::ops::sparse_softmax_cross_entropy(yp, yt));
      },
      y, p);
  td::metrics::SparseCategoricalAccuracy whole;
  td::metrics::Mean whole_loss;
  whole.update_state(labels, logits);
  whole_loss.update_state(td::ops::sparse_softmax_cross_entropy(logits, labels));
  REQUIRE(distributed.result() == Approx(4.0 / 6.0));
  REQUIRE(distributed.result() == Approx(whole.result()));
  REQUIRE(distributed_loss.result() == Approx(whole_loss.result()).epsilon(1e-12));
  REQUIRE(distributed.replica_states().size() == 2);
}

TEST_CASE("the step function of docs/concepts.md runs as written", "[cpu][distribute]") {
  td::Generator generator(/*seed=*/3);
  const td::Tensor x = td::Tensor::normal({64, 784}, generator);
  std::vector<int64_t> label_values(64);
  for (size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<int64_t>(i % 10);
  const td::Tensor y = td::Tensor::from_vector(label_values);

  // ---- from docs/concepts.md ----
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  const int64_t global_batch = 64;
  auto scope = strategy.scope();
  td::nn::Sequential model({td::nn::Dense(128, td::nn::Activation::kRelu), td::nn::Dense(10)});
  model.build({784});
  td::optim::SGD optimizer({.learning_rate = 0.1, .global_clipnorm = 1.0});
  td::metrics::Mean train_loss("train_loss");

  auto train_step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
    td::GradientTape tape;
    td::Tensor logits = model(x, /*training=*/true);
    td::Tensor per_example = td::losses::sparse_categorical_crossentropy(y, logits, true);
    td::Tensor loss = td::compute_average_loss(per_example, global_batch);
    auto grads = tape.gradient(loss, model.trainable_variables());
    optimizer.apply_gradients(ctx, grads, model.trainable_variables());
    train_loss.update_state(per_example);
    return loss;
  };

  td::PerReplica<td::Tensor> xs({x.slice(0, 32), x.slice(32, 64)});
  td::PerReplica<td::Tensor> ys({y.slice(0, 32), y.slice(32, 64)});
  td::PerReplica<td::Tensor> losses = strategy.run(train_step, xs, ys);
  float loss = strategy.reduce(td::ReduceOp::kSum, losses).item<float>();
  double mean = train_loss.result();
  // ---- end ----

  // The summed per-replica losses are the mean loss over the global batch.
  REQUIRE(loss == Approx(mean).epsilon(1e-5));
  REQUIRE(optimizer.iterations() == 1);
}

namespace {

/// A whole training step on `replicas` CPU replicas: the dataset's split, the forward and
/// backward of a ReLU MLP, the gradient all-reduce and the fused Adam update.
class TrainingStep {
 public:
  explicit TrainingStep(int replicas)
      : strategy_(td::MirroredStrategy::cpu(replicas)),
        model_({td::nn::Dense(64, td::nn::Activation::kRelu), td::nn::Dense(10)}) {
    {
      auto scope = strategy_.scope();
      model_.build({32});
      optimizer_ = std::make_unique<td::optim::Adam>();
      optimizer_->build(model_.trainable_variables());
    }
    td::Generator g(3);
    const td::Tensor x = td::Tensor::normal({64, 32}, g);
    std::vector<int64_t> y(64);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 10);
    data_ = std::make_unique<td::data::DistributedDataset>(strategy_.distribute_dataset(
        td::data::from_tensor_slices({x, td::Tensor::from_vector(y)}).batch(32).repeat()));
    variables_ = model_.trainable_variables();
  }

  void operator()() {
    auto step = [&](td::ReplicaContext& ctx, const td::data::Batch& b) {
      td::GradientTape tape;
      const td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(b.labels(), model_(b.features(), true), true),
          32);
      optimizer_->apply_gradients(ctx, tape.gradient(loss, variables_), variables_);
      return loss;
    };
    REQUIRE(data_->next(pieces_));
    strategy_
        .reduce(td::ReduceOp::kSum, strategy_.run(step, td::PerReplica<td::data::Batch>(pieces_)))
        .item<float>();
  }

 private:
  td::MirroredStrategy strategy_;
  td::nn::Sequential model_;
  std::unique_ptr<td::optim::Adam> optimizer_;
  std::unique_ptr<td::data::DistributedDataset> data_;
  std::vector<td::Variable> variables_;
  std::vector<td::data::Batch> pieces_;
};

}  // namespace

TEST_CASE("a training step on one CPU replica allocates nothing from the system after warm-up",
          "[cpu][distribute]") {
  // One replica thread runs the step's ops in the same order every step, so after the first
  // step every block it needs is in the caching allocator's free lists.
  TrainingStep run_step(1);
  for (int i = 0; i < 2; ++i) run_step();
  std::vector<uint64_t> requests;
  const td::AllocatorStats before = td::cpu_allocator().stats();
  for (int i = 0; i < 20; ++i) {
    const uint64_t start = td::cpu_allocator().stats().requests;
    run_step();
    requests.push_back(td::cpu_allocator().stats().requests - start);
  }
  const td::AllocatorStats after = td::cpu_allocator().stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits - before.cache_hits == after.requests - before.requests);
  INFO("allocator requests per step: " << requests[0]);
  CHECK(std::set<uint64_t>(requests.begin(), requests.end()).size() == 1);
  CHECK(after.bytes_in_use == before.bytes_in_use);
}

TEST_CASE("training steps on 2 CPU replicas stop allocating from the system", "[cpu][distribute]") {
  // Two replica threads share the free lists, and how their steps interleave decides how many
  // blocks of a size are live at once: a new peak still takes a block from the system, until
  // the worst interleaving has been met. System allocations must stop: 20 steps in a row
  // without one, well before 300 steps.
  TrainingStep run_step(2);
  int quiet = 0, steps = 0;
  uint64_t first_allocs = 0;
  for (; steps < 300 && quiet < 20; ++steps) {
    const uint64_t allocs = td::cpu_allocator().stats().system_allocs;
    if (steps == 0) first_allocs = allocs;
    run_step();
    quiet = td::cpu_allocator().stats().system_allocs == allocs ? quiet + 1 : 0;
  }
  INFO(steps << " steps, " << td::cpu_allocator().stats().system_allocs - first_allocs
             << " system allocations in all");
  CHECK(quiet == 20);
}

TEST_CASE("replicas compute with subnormals flushed to zero, as TensorFlow's CPU ops do",
          "[cpu][distribute]") {
#if defined(__x86_64__) || defined(__aarch64__)
  // 1e-20 * 1e-20 = 1e-40 is a subnormal float. 2^16 elements: a one-replica strategy's thread
  // gives the product to a team of every core (ops/cpu/parallel.h), which must flush as well.
  // Under ThreadSanitizer the product stays on one thread: libgomp is not instrumented, so the
  // sanitizer cannot see its barriers and would report the team's writes as races.
#if defined(__SANITIZE_THREAD__)
  const int64_t elements = 1024;
#else
  const int64_t elements = int64_t{1} << 16;
#endif
  const td::Tensor tiny = td::Tensor::full({elements}, 1e-20);
  auto product_is_zero = [&] {
    const std::vector<float> p = td::ops::mul(tiny, tiny).to_vector<float>();
    int zeros = 0;
    for (float v : p) zeros += v == 0.0f;
    return zeros == static_cast<int>(p.size()) ? 1 : zeros == 0 ? 0 : -1;  // -1: mixed
  };
  REQUIRE(product_is_zero() == 0);  // the calling thread keeps IEEE subnormals
  auto mirrored = td::MirroredStrategy::cpu(2);
  CHECK(mirrored.run([&](td::ReplicaContext&) { return product_is_zero(); }).values() ==
        std::vector<int>{1, 1});
  auto single = td::MirroredStrategy::cpu(1);  // one replica thread with every core
  CHECK(single.run([&](td::ReplicaContext&) { return product_is_zero(); }).values() ==
        std::vector<int>{1});
  // On the calling thread, whose OpenMP team was made above with IEEE subnormals: the run
  // flushes (the team takes the mode from the thread), then the caller's mode comes back.
  td::OneDeviceStrategy one;
  CHECK(one.run([&](td::ReplicaContext&) { return product_is_zero(); }).values() ==
        std::vector<int>{1});
  CHECK(product_is_zero() == 0);
  const bool was = td::set_flush_denormals(false);  // TANDEM_FLUSH_DENORMALS=0
  CHECK(mirrored.run([&](td::ReplicaContext&) { return product_is_zero(); }).values() ==
        std::vector<int>{0, 0});
  td::set_flush_denormals(was);
#else
  WARN("no flush-to-zero control on this CPU: nothing to check");
#endif
}

TEST_CASE("apply_gradients outside strategy.run updates every replica's copies alike",
          "[cpu][distribute]") {
  // A porting user's call in cross-replica context: tf.distribute applies it to every copy
  // (strategy.extended.update); updating replica 0's copy alone would split the replicas.
  auto strategy = td::MirroredStrategy::cpu(2);
  td::Variable w;
  std::unique_ptr<td::optim::Adam> adam;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", vec({1, -2}));
    adam = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 0.1});
    adam->build({w});
  }
  adam->apply_gradients({vec({0.5, -1})}, {w});
  adam->apply_gradients({vec({0.25, 2})}, {w});
  // The same values as one replica's Adam with the same gradients, on both copies, slots too.
  td::Variable one("w", vec({1, -2}));
  td::optim::Adam reference({.learning_rate = 0.1});
  reference.apply_gradients({vec({0.5, -1})}, {one});
  reference.apply_gradients({vec({0.25, 2})}, {one});
  for (int r = 0; r < 2; ++r) {
    INFO("copy " << r);
    CHECK(w.copy(r).to_vector<float>() == one.value().to_vector<float>());
    CHECK(adam->iterations_variable().copy(r).item<int64_t>() == 2);
  }
  // Training inside run afterwards keeps the copies equal.
  strategy.run([&](td::ReplicaContext& ctx) {
    const td::Tensor g = ctx.replica_id_in_sync_group() == 0 ? vec({1, 0}) : vec({0, 1});
    adam->apply_gradients(ctx, {g}, {w});
  });
  CHECK(w.copy(0).to_vector<float>() == w.copy(1).to_vector<float>());
  CHECK(adam->iterations() == 3);
}
