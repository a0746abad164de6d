// The flat reduce_scatter and all_gather of the in-process collectives (Note [flat ranges] in
// communicator.h): each rank's range of the reduction is bitwise all_reduce's, for uneven and
// empty ranges, on inputs whose sums depend on the order of the additions; all_gather rebuilds
// the whole buffer; invalid arguments are named on every rank.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/rank_threads.h"
#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/core/half.h"
#include "tandem/tensor/tensor.h"

namespace td = tandem;
using td::collectives::InProcessCommunicator;
using td::collectives::InProcessRendezvous;
using td::testing::message_of;
using td::testing::require_no_errors;
using td::testing::run_ranks;

namespace {

/// `n` values of `dtype` from `seed`: normal values scaled by powers of ten from 1e-8 to 1e8
/// (1e-3 to 1e3 for the 16-bit types), so that the rounding of a sum depends on the order in
/// which its terms are added.
td::Tensor mixed_magnitudes(int64_t n, td::DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  const int widest = td::dtype_size(dtype) == 2 ? 3 : 8;
  std::uniform_int_distribution<int> exponent(-widest, widest);
  td::Tensor t = td::Tensor::empty({n}, dtype);
  td::dispatch_any_numeric(dtype, "mixed_magnitudes", [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const double v = normal(rng) * std::pow(10.0, exponent(rng));
      if constexpr (std::is_same_v<T, double>) {
        p[i] = v;
      } else {
        p[i] = T(static_cast<float>(v));
      }
    }
  });
  return t;
}

/// Ranges of `n` elements for `ranks` ranks, by name: "even" (equal shares), "uneven" (random
/// cuts, rank 0's range empty and, from 3 ranks, another empty one in the middle), "first"
/// (everything on rank 0, the others empty).
std::vector<int64_t> ranges(const std::string& kind, int64_t n, int ranks, uint64_t seed) {
  std::vector<int64_t> offsets(static_cast<size_t>(ranks) + 1, n);
  offsets[0] = 0;
  if (kind == "first") return offsets;
  if (kind == "even") {
    for (int r = 1; r < ranks; ++r) offsets[static_cast<size_t>(r)] = n * r / ranks;
    return offsets;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> cut(0, n);
  for (int r = 1; r < ranks; ++r) offsets[static_cast<size_t>(r)] = cut(rng);
  std::sort(offsets.begin(), offsets.end());
  offsets[1] = 0;  // rank 0 owns nothing
  if (ranks >= 3) offsets[static_cast<size_t>(ranks) - 1] = offsets[static_cast<size_t>(ranks) - 2];
  return offsets;
}

/// memcmp's equality, also for zero bytes (where a pointer may be null).
bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

const char* bytes_at(const td::Tensor& t, int64_t element) {
  return static_cast<const char*>(t.raw_data()) +
         static_cast<size_t>(element) * td::dtype_size(t.dtype());
}

}  // namespace

TEST_CASE("flat reduce_scatter gives all_reduce's bits on each range, all_gather the whole buffer",
          "[cpu][collectives]") {
  for (int ranks : {2, 3, 4}) {
    for (td::DType dtype :
         {td::DType::kFloat32, td::DType::kFloat64, td::DType::kBFloat16, td::DType::kFloat16}) {
      for (td::ReduceOp op : {td::ReduceOp::kSum, td::ReduceOp::kMean, td::ReduceOp::kMax}) {
        // 70001 elements: more than one rank's share of the work (16K elements at least), so
        // ranks reduce elements that other ranks own.
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{70001}}) {
          for (const char* kind : {"even", "uneven", "first"}) {
            const std::vector<int64_t> offsets = ranges(kind, n, ranks, 7 * n + ranks);
            INFO(ranks << " ranks, " << dtype << ", " << op << ", " << n << " elements, " << kind
                       << " ranges");
            auto group = InProcessRendezvous::create(ranks);
            std::vector<std::string> failures(static_cast<size_t>(ranks));
            std::vector<td::Tensor> inputs(static_cast<size_t>(ranks));
            std::vector<td::Tensor> reduced(static_cast<size_t>(ranks));
            std::vector<td::collectives::CollectiveStats> stats(static_cast<size_t>(ranks));
            require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
              const auto r = static_cast<size_t>(rank);
              std::string& fail = failures[r];
              const td::Tensor input = mixed_magnitudes(n, dtype, 1000 * ranks + rank);
              std::vector<td::Tensor> in = {input};
              std::vector<td::Tensor> out = {td::Tensor::empty_like(input)};
              comm.all_reduce(in, out, op)->wait();
              td::Tensor mine;  // allocated by the call
              comm.reduce_scatter(input, mine, offsets, op)->wait();
              if (mine.rank() != 1 || mine.numel() != offsets[r + 1] - offsets[r] ||
                  mine.dtype() != dtype) {
                fail += "reduce_scatter's output is " + mine.to_string(0) + "; ";
                return;
              }
              if (!same_bytes(mine.raw_data(), bytes_at(out[0], offsets[r]), mine.nbytes()))
                fail += "reduce_scatter differs from all_reduce's range; ";
              // Every rank's buffer holds other values outside its own range.
              td::Tensor buffer = td::Tensor::full({n}, -3.0 - rank, dtype);
              if (mine.nbytes() > 0)
                std::memcpy(const_cast<char*>(bytes_at(buffer, offsets[r])), mine.raw_data(),
                            mine.nbytes());
              comm.all_gather(buffer, offsets)->wait();
              if (!same_bytes(buffer.raw_data(), out[0].raw_data(), buffer.nbytes()))
                fail += "reduce_scatter + all_gather differs from all_reduce; ";
              inputs[r] = input;
              reduced[r] = out[0];
              stats[r] = comm.stats();
            }));
            for (int r = 0; r < ranks; ++r) {
              CHECK(failures[static_cast<size_t>(r)].empty());
              CHECK(stats[static_cast<size_t>(r)].reduce_scatter == 1);
              CHECK(stats[static_cast<size_t>(r)].all_gather == 1);
              CHECK(stats[static_cast<size_t>(r)].all_reduce == 1);
            }
            // The inputs are such that the order of the additions shows in the bits: summed in
            // reverse rank order, some element comes out different.
            if (dtype == td::DType::kFloat32 && op == td::ReduceOp::kSum && ranks >= 3 &&
                n == 70001 && std::string(kind) == "even") {
              const float* sum = reduced[0].data<float>();
              int64_t different = 0;
              for (int64_t i = 0; i < n; ++i) {
                float reverse = inputs[static_cast<size_t>(ranks) - 1].data<float>()[i];
                for (int k = ranks - 2; k >= 0; --k)
                  reverse += inputs[static_cast<size_t>(k)].data<float>()[i];
                different += reverse != sum[i];
              }
              CHECK(different > 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("flat all_gather moves any dtype, bool included", "[cpu][collectives]") {
  constexpr int kRanks = 3;
  const std::vector<int64_t> offsets = {0, 2, 2, 5};
  auto group = InProcessRendezvous::create(kRanks);
  std::vector<std::vector<int64_t>> ints(kRanks);
  std::vector<std::vector<uint8_t>> flags(kRanks);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    // Rank r's buffer holds r + 1 everywhere; its range ends up holding the owner's value.
    td::Tensor numbers = td::Tensor::full({5}, rank + 1, td::DType::kInt64);
    comm.all_gather(numbers, offsets)->wait();
    ints[static_cast<size_t>(rank)] = numbers.to_vector<int64_t>();
    td::Tensor bits = td::Tensor::full({5}, rank == 2 ? 1 : 0, td::DType::kBool);
    comm.all_gather(bits, offsets)->wait();
    flags[static_cast<size_t>(rank)] = bits.to_vector<uint8_t>();
  }));
  for (int r = 0; r < kRanks; ++r) {
    CHECK(ints[static_cast<size_t>(r)] == std::vector<int64_t>{1, 1, 3, 3, 3});
    CHECK(flags[static_cast<size_t>(r)] == std::vector<uint8_t>{0, 0, 1, 1, 1});
  }
}

TEST_CASE("flat reduce_scatter and all_gather name what is wrong with their arguments",
          "[cpu][collectives]") {
  // One rank: the call raises at once.
  auto single = InProcessRendezvous::create(1);
  InProcessCommunicator& alone = single->communicator(0);
  const td::Tensor ten = td::Tensor::ones({10});
  td::Tensor out;
  const std::vector<int64_t> three = {0, 5, 10};
  REQUIRE_THROWS_WITH(alone.reduce_scatter(ten, out, three),
                      Catch::Contains("reduce_scatter: offsets has 3 entries [0, 5, 10]; 1 ranks "
                                      "need 2 (offsets[0] = 0, ..., offsets[1] = 10)"));
  const std::vector<int64_t> whole = {0, 10};
  REQUIRE_THROWS_WITH(alone.reduce_scatter(td::Tensor::ones({2, 5}), out, whole),
                      Catch::Contains("the input is float32[2, 5]; it must be 1-D"));
  REQUIRE_THROWS_WITH(alone.reduce_scatter(td::Tensor::zeros({10}, td::DType::kBool), out, whole),
                      Catch::Contains("the input is bool"));
  td::Tensor short_output = td::Tensor::empty({3});
  REQUIRE_THROWS_WITH(alone.reduce_scatter(ten, short_output, whole),
                      Catch::Contains("the output is float32[3] on cpu:0; rank 0's range [0, 10) "
                                      "needs float32[10] on cpu:0"));
  td::Tensor buffer = td::Tensor::ones({10});
  const std::vector<int64_t> nine = {0, 9};
  REQUIRE_THROWS_WITH(alone.all_gather(buffer, nine),
                      Catch::Contains("all_gather: offsets[1] = 9 in [0, 9] but the buffer has 10 "
                                      "elements"));
  alone.reduce_scatter(ten, out, whole)->wait();  // one rank: the input itself
  CHECK(out.to_vector<float>() == std::vector<float>(10, 1.0f));
  CHECK(alone.stats().reduce_scatter == 5);  // every call counts, failed ones too
  CHECK(alone.stats().all_gather == 1);

  // Several ranks: one rank's invalid offsets are reported on every rank.
  struct Case {
    std::vector<int64_t> offsets;  // rank 1's; rank 0 passes {0, 4, 10}
    const char* message;
  };
  const std::vector<Case> cases = {
      {{0, 7, 5},
       "offsets[2] = 5 is less than offsets[1] = 7 in [0, 7, 5]; the offsets must be "
       "nondecreasing"},
      {{0, 4, 9}, "offsets[2] = 9 in [0, 4, 9] but the input has 10 elements"},
      {{1, 4, 10}, "offsets[0] is 1 in [1, 4, 10]; the first range starts at 0"},
      {{0, 10}, "offsets has 2 entries [0, 10]; 2 ranks need 3"},
  };
  auto group = InProcessRendezvous::create(2);
  for (const Case& c : cases) {
    INFO(c.message);
    const auto errors = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
      const std::vector<int64_t> good = {0, 4, 10};
      td::Tensor output;
      comm.reduce_scatter(td::Tensor::ones({10}), output, rank == 1 ? c.offsets : good)->wait();
    });
    for (const auto& e : errors) {
      REQUIRE(e);
      CHECK_THAT(message_of(e), Catch::Contains("reduce_scatter #") &&
                                    Catch::Contains("replica 1 passed invalid arguments: ") &&
                                    Catch::Contains(c.message));
    }
  }
  // Valid but different offsets: a mismatch, naming both calls.
  const auto mismatch = run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    const std::vector<int64_t> offsets = {0, rank == 0 ? 4 : 5, 10};
    td::Tensor b = td::Tensor::ones({10});
    comm.all_gather(b, offsets)->wait();
  });
  for (const auto& e : mismatch) {
    REQUIRE(e);
    CHECK_THAT(message_of(e),
               Catch::Contains("do not match") &&
                   Catch::Contains("replica 0 called all_gather of float32[10] at offsets "
                                   "[0, 4, 10] but replica 1 called all_gather of float32[10] at "
                                   "offsets [0, 5, 10]"));
  }
  // Everyone raised at the same calls: the group is still in step.
  std::vector<std::vector<float>> after(2);
  require_no_errors(run_ranks(*group, [&](int rank, InProcessCommunicator& comm) {
    const std::vector<int64_t> offsets = {0, 4, 10};
    td::Tensor output;
    comm.reduce_scatter(td::Tensor::full({10}, rank + 1.0), output, offsets)->wait();
    after[static_cast<size_t>(rank)] = output.to_vector<float>();
  }));
  CHECK(after[0] == std::vector<float>(4, 3.0f));
  CHECK(after[1] == std::vector<float>(6, 3.0f));
}
