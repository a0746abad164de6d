// Loss scaling outside strategy.run: with a strategy's scope open (cross-replica context),
// compute_average_loss without a global batch size and scale_regularization_loss raise, as
// TensorFlow does; outside any strategy they use one replica (the default strategy).
#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;

namespace {
td::Tensor vec(std::vector<float> values) { return td::Tensor::from_vector(values); }
}  // namespace

TEST_CASE("loss scaling in cross-replica context raises and says what to do",
          "[cpu][distribute]") {
  const td::Tensor per_example = vec({1, 2, 3, 4});
  auto strategy = td::MirroredStrategy::cpu(2);
  {
    auto scope = strategy.scope();
    // TensorFlow 2.21 raises here; a silent divide by one replica would give 2.5 and 2.
    REQUIRE_THROWS_WITH(td::compute_average_loss(per_example),
                        Catch::Contains("compute_average_loss without a global_batch_size") &&
                            Catch::Contains("cross-replica context") &&
                            Catch::Contains("MirroredStrategy with 2 replicas") &&
                            Catch::Contains("inside strategy.run") &&
                            Catch::Contains("pass global_batch_size"));
    REQUIRE_THROWS_WITH(td::scale_regularization_loss(vec({4})),
                        Catch::Contains("scale_regularization_loss") &&
                            Catch::Contains("cross-replica context"));
    // An explicit global batch is unambiguous anywhere.
    CHECK(td::compute_average_loss(per_example, 8).item<float>() == 1.25f);
    // Inside run the scope's strategy gives the divisor: 10 / (4 x 2), 4 / 2.
    td::PerReplica<td::Tensor> losses = strategy.run(
        [&](td::ReplicaContext&) { return td::compute_average_loss(per_example); });
    CHECK(losses[0].item<float>() == 1.25f);
    td::PerReplica<td::Tensor> regularization = strategy.run(
        [](td::ReplicaContext&) { return td::scale_regularization_loss(vec({4})); });
    CHECK(regularization[1].item<float>() == 2.0f);
  }
  // No scope open: the default strategy's single replica.
  CHECK(td::compute_average_loss(per_example).item<float>() == 2.5f);
  CHECK(td::scale_regularization_loss(vec({4})).item<float>() == 4.0f);
}
