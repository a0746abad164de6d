// The in-process collectives: closed-form results for 1..8 ranks (threads) and sizes 0, 1, odd
// and 16M floats, fixed reduction order, no steady-state allocation, and the failure paths
// (mismatch, timeout, departed peer, invalid arguments) raising on every rank.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "support/rank_threads.h"
#include "support/scoped_timeout.h"
#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"

namespace td = tandem;
using td::collectives::InProcessCommunicator;
using td::collectives::InProcessRendezvous;
using td::testing::message_of;
using td::testing::require_no_errors;
using td::testing::run_ranks;
using td::testing::ScopedTimeout;

namespace {

/// Rank r's element i: r + 1 + (i % 7) / 2, so sums, means and maxima are exact in float.
float closed_form(int rank, int64_t i) {
  return static_cast<float>(rank + 1) + 0.5f * static_cast<float>(i % 7);
}

}  // namespace

TEST_CASE("all_reduce sum, mean and max have closed-form results for 1..8 ranks",
          "[cpu][collectives]") {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t size : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{100003}}) {
      for (td::ReduceOp op : {td::ReduceOp::kSum, td::ReduceOp::kMean, td::ReduceOp::kMax}) {
        auto group = InProcessRendezvous::create(n);
        std::vector<std::vector<float>> results(static_cast<size_t>(n));
        require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
          td::Tensor t = td::Tensor::empty({size});
          float* data = t.data<float>();
          for (int64_t i = 0; i < size; ++i) data[i] = closed_form(rank, i);
          std::vector<td::Tensor> tensors{t};
          comm.all_reduce(tensors, op)->wait();
          results[static_cast<size_t>(rank)] = tensors[0].to_vector<float>();
        }));
        for (int rank = 0; rank < n; ++rank) {
          const std::vector<float>& got = results[static_cast<size_t>(rank)];
          REQUIRE(static_cast<int64_t>(got.size()) == size);
          for (int64_t i = 0; i < size; ++i) {
            const float k = 0.5f * static_cast<float>(i % 7);
            float want = 0;
            if (op == td::ReduceOp::kSum) want = static_cast<float>(n * (n + 1) / 2) + n * k;
            if (op == td::ReduceOp::kMean) want = static_cast<float>(n + 1) / 2.0f + k;
            if (op == td::ReduceOp::kMax) want = static_cast<float>(n) + k;
            if (got[static_cast<size_t>(i)] != want) {
              INFO("ranks " << n << " size " << size << " op " << op << " rank " << rank
                            << " element " << i);
              REQUIRE(got[static_cast<size_t>(i)] == want);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("all_reduce of 16M floats is exact on 1..8 ranks", "[cpu][collectives]") {
  constexpr int64_t kSize = int64_t{16} << 20;
  constexpr int kMaxRanks = 8;
  // Inputs are filled once; the reduction runs out of place, so they serve every rank count.
  std::vector<td::Tensor> inputs(kMaxRanks), outputs(kMaxRanks);
  for (int r = 0; r < kMaxRanks; ++r) {
    inputs[static_cast<size_t>(r)] = td::Tensor::empty({kSize});
    outputs[static_cast<size_t>(r)] = td::Tensor::empty({kSize});
    float* data = inputs[static_cast<size_t>(r)].data<float>();
    for (int64_t i = 0; i < kSize; ++i) data[i] = closed_form(r, i);
  }
  for (int n = 1; n <= kMaxRanks; ++n) {
    auto group = InProcessRendezvous::create(n);
    require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
      std::vector<td::Tensor> in{inputs[static_cast<size_t>(rank)]};
      std::vector<td::Tensor> out{outputs[static_cast<size_t>(rank)]};
      comm.all_reduce(in, out, td::ReduceOp::kSum)->wait();
    }));
    const float base = static_cast<float>(n * (n + 1) / 2);
    const float step = static_cast<float>(n) * 0.5f;
    int64_t wrong = 0;
    for (int r = 0; r < n; ++r) {
      const float* data = outputs[static_cast<size_t>(r)].data<float>();
      for (int64_t i = 0; i < kSize; ++i)
        wrong += data[i] != base + step * static_cast<float>(i % 7);
    }
    INFO("ranks " << n);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("all_reduce sums in rank order, bitwise identical on every rank", "[cpu][collectives]") {
  constexpr int kRanks = 5;
  constexpr int64_t kSize = 50001;  // several rank slices, odd length
  std::vector<td::Tensor> inputs;
  for (int r = 0; r < kRanks; ++r) {
    td::Generator generator(/*seed=*/7, /*stream=*/static_cast<uint64_t>(r));
    inputs.push_back(td::Tensor::normal({kSize}, generator, 0.0, 1e3));
  }
  // The reference: ((x0 + x1) + x2) + ... in float, element by element.
  std::vector<float> reference = inputs[0].to_vector<float>();
  for (int r = 1; r < kRanks; ++r) {
    const std::vector<float> x = inputs[static_cast<size_t>(r)].to_vector<float>();
    for (int64_t i = 0; i < kSize; ++i)
      reference[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
  }
  auto group = InProcessRendezvous::create(kRanks);
  std::vector<td::Tensor> outputs(kRanks);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    // Out of place: the inputs stay untouched.
    std::vector<td::Tensor> in{inputs[static_cast<size_t>(rank)]};
    std::vector<td::Tensor> out{td::Tensor::empty_like(in[0])};
    comm.all_reduce(in, out, td::ReduceOp::kSum)->wait();
    outputs[static_cast<size_t>(rank)] = out[0];
  }));
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float> got = outputs[static_cast<size_t>(r)].to_vector<float>();
    REQUIRE(std::memcmp(got.data(), reference.data(), reference.size() * sizeof(float)) == 0);
  }
  td::Generator generator(/*seed=*/7, /*stream=*/0);
  const td::Tensor again = td::Tensor::normal({kSize}, generator, 0.0, 1e3);
  REQUIRE(inputs[0].to_vector<float>() == again.to_vector<float>());
}

TEST_CASE("a batched all_reduce reduces a mixed list in one call", "[cpu][collectives]") {
  constexpr int kRanks = 3;
  auto group = InProcessRendezvous::create(kRanks);
  std::vector<std::vector<td::Tensor>> lists(kRanks);
  std::vector<uint64_t> calls(kRanks);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    const double r = rank + 1;
    std::vector<td::Tensor> list{
        td::Tensor::full({3, 5}, r), td::Tensor::full({7}, r, td::DType::kFloat64),
        td::Tensor::zeros({0}, td::DType::kInt32), td::Tensor::full({1}, r, td::DType::kInt64)};
    const uint64_t before = comm.stats().all_reduce;
    comm.all_reduce(list, td::ReduceOp::kSum)->wait();
    calls[static_cast<size_t>(rank)] = comm.stats().all_reduce - before;
    lists[static_cast<size_t>(rank)] = list;
  }));
  REQUIRE(calls == std::vector<uint64_t>(kRanks, 1));
  for (const auto& list : lists) {
    for (float v : list[0].to_vector<float>()) REQUIRE(v == 6.0f);
    for (double v : list[1].to_vector<double>()) REQUIRE(v == 6.0);
    REQUIRE(list[2].numel() == 0);
    REQUIRE(list[3].item<int64_t>() == 6);
  }
}

TEST_CASE("all_reduce allocates nothing in steady state", "[cpu][collectives]") {
  constexpr int kRanks = 4;
  auto group = InProcessRendezvous::create(kRanks);
  std::vector<std::vector<td::Tensor>> buffers(kRanks);
  for (auto& b : buffers) b = {td::Tensor::ones({1 << 16}), td::Tensor::ones({33})};
  auto step = [&] {
    require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
      comm.all_reduce(buffers[static_cast<size_t>(rank)], td::ReduceOp::kMean)->wait();
      comm.barrier()->wait();
      comm.broadcast(buffers[static_cast<size_t>(rank)], /*root=*/1)->wait();
    }));
  };
  step();
  const uint64_t before = td::cpu_allocator().stats().system_allocs;
  for (int i = 0; i < 20; ++i) step();
  REQUIRE(td::cpu_allocator().stats().system_allocs == before);
  REQUIRE(buffers[3][0].to_vector<float>()[12345] == 1.0f);
}

TEST_CASE("all_gather with differing first dimensions", "[cpu][collectives]") {
  for (int n : {1, 2, 3, 5}) {
    auto group = InProcessRendezvous::create(n);
    std::vector<std::vector<td::Tensor>> gathered(static_cast<size_t>(n));
    require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
      // Rank r contributes r rows (rank 0 an empty tensor) of 3 values 100 r + j.
      td::Tensor input = td::Tensor::empty({rank, 3});
      for (int64_t j = 0; j < input.numel(); ++j) input.data<float>()[j] = 100.0f * rank + j;
      comm.all_gather(gathered[static_cast<size_t>(rank)], input)->wait();
    }));
    for (const auto& outputs : gathered) {
      REQUIRE(static_cast<int>(outputs.size()) == n);
      for (int k = 0; k < n; ++k) {
        const td::Tensor& t = outputs[static_cast<size_t>(k)];
        REQUIRE(t.shape() == td::Shape{k, 3});
        const std::vector<float> v = t.to_vector<float>();
        for (size_t j = 0; j < v.size(); ++j) REQUIRE(v[j] == 100.0f * k + static_cast<float>(j));
      }
    }
  }
}

TEST_CASE("broadcast and reduce_scatter have closed-form results", "[cpu][collectives]") {
  constexpr int kRanks = 4;
  auto group = InProcessRendezvous::create(kRanks);
  std::vector<std::vector<td::Tensor>> broadcasted(kRanks);
  std::vector<td::Tensor> scattered(kRanks);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{td::Tensor::full({5}, rank), td::Tensor::full({2, 2}, 10 * rank)};
    comm.broadcast(t, /*root=*/2)->wait();
    broadcasted[static_cast<size_t>(rank)] = t;
    // Row i of rank r's input holds r + i; rank r receives rows [2r, 2r + 2) of the sum.
    td::Tensor input = td::Tensor::empty({2 * kRanks, 3});
    for (int64_t i = 0; i < input.numel(); ++i)
      input.data<float>()[i] = static_cast<float>(rank + i / 3);
    td::Tensor output;
    comm.reduce_scatter(output, input, td::ReduceOp::kSum)->wait();
    scattered[static_cast<size_t>(rank)] = output;
    comm.barrier()->wait();
  }));
  for (int r = 0; r < kRanks; ++r) {
    for (float v : broadcasted[static_cast<size_t>(r)][0].to_vector<float>()) REQUIRE(v == 2.0f);
    for (float v : broadcasted[static_cast<size_t>(r)][1].to_vector<float>()) REQUIRE(v == 20.0f);
    const td::Tensor& out = scattered[static_cast<size_t>(r)];
    REQUIRE(out.shape() == td::Shape{2, 3});
    const std::vector<float> v = out.to_vector<float>();
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t row = 2 * r + i / 3;  // sum over ranks k of (k + row) = 6 + 4 row
      REQUIRE(v[static_cast<size_t>(i)] == static_cast<float>(6 + kRanks * row));
    }
  }
}

TEST_CASE("ranks calling different collectives all raise a mismatch error", "[cpu][collectives]") {
  ScopedTimeout timeout(std::chrono::seconds(2));
  auto group = InProcessRendezvous::create(3);
  const auto errors = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{td::Tensor::ones({rank == 1 ? 5 : 4})};
    comm.all_reduce(t, td::ReduceOp::kSum)->wait();
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    const std::string message = message_of(e);
    INFO(message);
    REQUIRE_THAT(message,
                 Catch::Contains("all_reduce #1") && Catch::Contains("do not match") &&
                     Catch::Contains("replica 1 called all_reduce(sum) of 1 tensor: float32[5]"));
  }
  // Everyone raised at the same call, so the group is still in step and usable.
  std::vector<float> after(3);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{td::Tensor::ones({4})};
    comm.all_reduce(t, td::ReduceOp::kSum)->wait();
    after[static_cast<size_t>(rank)] = t[0].to_vector<float>()[3];
  }));
  REQUIRE(after == std::vector<float>(3, 3.0f));
  const auto kinds = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{td::Tensor::ones({4})};
    if (rank == 2) {
      comm.broadcast(t, 0)->wait();
    } else {
      comm.all_reduce(t, td::ReduceOp::kSum)->wait();
    }
  });
  for (const auto& e : kinds) {
    REQUIRE(e);
    REQUIRE_THAT(message_of(e), Catch::Contains("collective call #3") &&
                                    Catch::Contains("replica 2 called broadcast(root 0)"));
  }
}

TEST_CASE("a rank that skips a collective makes the others time out, naming it",
          "[cpu][collectives]") {
  ScopedTimeout timeout(std::chrono::milliseconds(1000));
  auto group = InProcessRendezvous::create(3);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{td::Tensor::ones({8})};
    comm.all_reduce(t, td::ReduceOp::kSum)->wait();                 // #1, everyone
    if (rank != 2) comm.all_reduce(t, td::ReduceOp::kSum)->wait();  // #2, rank 2 skips it
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(seconds < 3.0);
  REQUIRE_FALSE(errors[2]);
  for (int r : {0, 1}) {
    REQUIRE(errors[static_cast<size_t>(r)]);
    REQUIRE_THROWS_AS(std::rethrow_exception(errors[static_cast<size_t>(r)]), td::TimeoutError);
    const std::string message = message_of(errors[static_cast<size_t>(r)]);
    INFO(message);
    REQUIRE_THAT(message, Catch::Contains("all_reduce #2 timed out after 1 s") &&
                              Catch::Contains("replica 2 did not arrive") &&
                              Catch::Contains("replicas 0, 1 were waiting"));
  }
  // The group stays aborted (a late rank raises at once) until reset.
  const auto late = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    if (rank == 2) comm.barrier()->wait();
  });
  REQUIRE(late[2]);
  REQUIRE_THAT(message_of(late[2]), Catch::Contains("timed out"));
  group->reset();
  require_no_errors(
      run_ranks(*group, [&](int, InProcessCommunicator& comm) { comm.barrier()->wait(); }));
}

TEST_CASE("a departed rank releases its waiting peers at once", "[cpu][collectives]") {
  ScopedTimeout timeout(std::chrono::seconds(60));  // must not be what ends the wait
  auto group = InProcessRendezvous::create(3);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    if (rank == 1) {
      group->depart(1);  // returns without calling anything
      return;
    }
    comm.barrier()->wait();
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(seconds < 5.0);
  for (int r : {0, 2}) {
    REQUIRE(errors[static_cast<size_t>(r)]);
    REQUIRE_THAT(message_of(errors[static_cast<size_t>(r)]),
                 Catch::Contains("barrier #1: replica 1 returned from the replica function after "
                                 "0 collective calls"));
  }
}

TEST_CASE("invalid arguments on one rank are reported on every rank", "[cpu][collectives]") {
  auto group = InProcessRendezvous::create(2);
  const auto errors = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    std::vector<td::Tensor> t{rank == 1 ? td::Tensor() : td::Tensor::ones({2})};
    comm.all_reduce(t, td::ReduceOp::kSum)->wait();
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    REQUIRE_THAT(message_of(e), Catch::Contains("replica 1 passed invalid arguments: tensor 0 is "
                                                "undefined"));
  }
  // With one rank there is no peer to tell: the call raises directly.
  auto single = InProcessRendezvous::create(1);
  std::vector<td::Tensor> flags{td::Tensor::zeros({1}, td::DType::kBool)};
  REQUIRE_THROWS_WITH(single->communicator(0).all_reduce(flags, td::ReduceOp::kMax),
                      Catch::Contains("tensor 0 is bool"));
}

TEST_CASE("the collective timeout comes from TANDEM_COLLECTIVE_TIMEOUT or the setter",
          "[cpu][collectives]") {
  const auto before = td::collectives::collective_timeout();
  REQUIRE(before.count() > 0);
  {
    ScopedTimeout timeout(std::chrono::milliseconds(1500));
    REQUIRE(td::collectives::collective_timeout() == std::chrono::milliseconds(1500));
  }
  REQUIRE(td::collectives::collective_timeout() == before);
  REQUIRE_THROWS_WITH(td::collectives::set_collective_timeout(std::chrono::milliseconds(0)),
                      Catch::Contains("must be positive"));
}

namespace {
/// A backend that supports nothing, to check the default error text.
class NothingBackend final : public td::collectives::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "nothing"; }
};
}  // namespace

TEST_CASE("unsupported collectives say which backend lacks what", "[cpu][collectives]") {
  NothingBackend backend;
  std::vector<td::Tensor> outputs;
  REQUIRE_THROWS_WITH(backend.all_gather(outputs, td::Tensor::ones({1})),
                      Catch::StartsWith("backend nothing does not support all_gather"));
  REQUIRE_THROWS_WITH(backend.barrier(),
                      Catch::StartsWith("backend nothing does not support barrier"));
  REQUIRE(backend.stats().all_gather == 1);
}
