// Keras parity of Mean, Sum, Accuracy and SparseCategoricalAccuracy under sample weights (the
// wmean.* records of tests/fixtures/keras_parity.txt, to 1e-6 relative): values or labels [N],
// [N, 1] and [N, C] with weights none, [N], [N, 1] and [N, C], with N == C and N != C.
#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "support/keras_fixtures.h"
#include "support/require_gpu.h"
#include "tandem/core/device.h"
#include "tandem/metrics/metrics.h"

namespace td = tandem;
namespace metrics = tandem::metrics;
using td::testing::KerasFixtures;

namespace {

const char* const kShapes[] = {"nn", "nc"};  // N == C == 4; N = 5, C = 3
const char* const kValueTags[] = {"n", "n1", "nc"};
const char* const kWeightTags[] = {"none", "n", "n1", "nc"};

/// Feeds two batches of <shape>.<v> inputs, weighted by <shape>.weight_<w> (or not), to a fresh
/// metric through `update`, and compares result() (and count, unless `with_count` is false)
/// with Keras's records after each; where Keras refuses the weights, expects the same refusal.
template <typename M>
void check_case(const std::string& metric, const std::string& shape, const std::string& v,
                const std::string& w, bool with_count,
                const std::function<void(M&, int, const td::Tensor&)>& update) {
  const KerasFixtures& f = KerasFixtures::get();
  const std::string tag = "wmean." + shape + "." + metric + ".v" + v + ".w" + w;
  INFO(tag);
  M m;
  for (int b = 0; b < 2; ++b) {
    const std::string n = std::to_string(b);
    const td::Tensor weight =
        w == "none" ? td::Tensor() : f.tensor("wmean." + shape + ".weight_" + w + n);
    if (f.has(tag + ".raises")) {
      CHECK_THROWS_WITH(update(m, b, weight), Catch::Contains(m.name()) &&
                                                  Catch::Contains("sample_weight") &&
                                                  Catch::Contains(weight.shape().to_string()));
      return;
    }
    update(m, b, weight);
    INFO("after batch " << b);
    const double want = f.tensor(tag + ".result" + n).item<double>();
    CHECK(m.result() == Approx(want).epsilon(1e-6).margin(1e-12));
    if (with_count) {
      const double count = f.tensor(tag + ".count" + n).item<double>();
      CHECK(m.combined_state().scalar("count") == Approx(count).epsilon(1e-6).margin(1e-12));
    }
  }
}

td::Tensor input(const std::string& shape, const std::string& name, int b) {
  return KerasFixtures::get().tensor("wmean." + shape + "." + name + std::to_string(b));
}

}  // namespace

TEST_CASE("Mean and Sum weigh samples as Keras for values and weights of each shape",
          "[cpu][metrics][keras]") {
  for (const std::string shape : kShapes) {
    for (const std::string v : kValueTags) {
      for (const std::string w : kWeightTags) {
        check_case<metrics::Mean>("mean", shape, v, w, /*with_count=*/true,
                                  [&](metrics::Mean& m, int b, const td::Tensor& weight) {
                                    m.update_state(input(shape, "values_" + v, b), weight);
                                  });
        check_case<metrics::Sum>("sum", shape, v, w, /*with_count=*/false,
                                 [&](metrics::Sum& m, int b, const td::Tensor& weight) {
                                   m.update_state(input(shape, "values_" + v, b), weight);
                                 });
      }
    }
  }
}

TEST_CASE("Accuracy and SparseCategoricalAccuracy weigh samples as Keras for each shape",
          "[cpu][metrics][keras]") {
  for (const std::string shape : kShapes) {
    for (const std::string v : kValueTags) {
      for (const std::string w : kWeightTags) {
        check_case<metrics::Accuracy>("accuracy", shape, v, w, /*with_count=*/true,
                                      [&](metrics::Accuracy& m, int b, const td::Tensor& weight) {
                                        m.update_state(input(shape, "acc_true_" + v, b),
                                                       input(shape, "acc_pred_" + v, b), weight);
                                      });
        check_case<metrics::SparseCategoricalAccuracy>(
            "sparse_categorical_accuracy", shape, v, w, /*with_count=*/true,
            [&](metrics::SparseCategoricalAccuracy& m, int b, const td::Tensor& weight) {
              m.update_state(input(shape, "sca_true_" + v, b), input(shape, "sca_pred_" + v, b),
                             weight);
            });
      }
    }
  }
}

TEST_CASE("Weighted Mean, Sum and accuracies take CUDA tensors and agree with the CPU",
          "[cuda][metrics]") {
  TANDEM_REQUIRE_GPU();
  const td::Device gpu = td::Device::cuda(0);
  const td::Tensor values = input("nn", "values_nc", 0), weight = input("nn", "weight_n", 0);
  const td::Tensor t = input("nn", "acc_true_nc", 0), p = input("nn", "acc_pred_nc", 0);
  const td::Tensor labels = input("nn", "sca_true_n1", 0), logits = input("nn", "sca_pred_n1", 0);
  metrics::Mean cpu_mean, gpu_mean;
  metrics::Sum cpu_sum, gpu_sum;
  metrics::Accuracy cpu_accuracy, gpu_accuracy;
  metrics::SparseCategoricalAccuracy cpu_sparse, gpu_sparse;
  cpu_mean.update_state(values, weight);
  gpu_mean.update_state(values.to(gpu), weight.to(gpu));
  cpu_sum.update_state(values, weight);
  gpu_sum.update_state(values.to(gpu), weight.to(gpu));
  cpu_accuracy.update_state(t, p, weight);
  gpu_accuracy.update_state(t.to(gpu), p.to(gpu), weight.to(gpu));
  cpu_sparse.update_state(labels, logits, weight);
  gpu_sparse.update_state(labels.to(gpu), logits.to(gpu), weight.to(gpu));
  CHECK(gpu_mean.result() == cpu_mean.result());
  CHECK(gpu_sum.result() == cpu_sum.result());
  CHECK(gpu_accuracy.result() == cpu_accuracy.result());
  CHECK(gpu_sparse.result() == cpu_sparse.result());
  CHECK(cpu_mean.result() ==
        Approx(KerasFixtures::get().tensor("wmean.nn.mean.vnc.wn.result0").item<double>())
            .epsilon(1e-6));
}
