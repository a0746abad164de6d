// Learning-rate schedules at chosen steps, against values printed by Keras 3.15
// (keras.optimizers.schedules, float32), and their use as an optimizer's learning rate.
#include <catch2/catch.hpp>
#include <cstdint>
#include <utility>
#include <vector>

#include "tandem/optim/adam.h"
#include "tandem/optim/schedules.h"

namespace optim = tandem::optim;
namespace schedules = tandem::optim::schedules;

namespace {
/// Checks schedule(step) against Keras' float32 value at each step (relative 1e-6).
void check_steps(const schedules::LearningRateSchedule& schedule,
                 const std::vector<std::pair<int64_t, double>>& keras) {
  for (const auto& [step, want] : keras) {
    CAPTURE(step);
    CHECK(schedule(step) == Approx(want).epsilon(1e-6).margin(1e-9));
  }
}
}  // namespace

TEST_CASE("ExponentialDecay matches Keras", "[cpu][optim]") {
  check_steps(schedules::ExponentialDecay(0.1, 100, 0.5), {{0, 0.100000001},
                                                           {1, 0.0993092507},
                                                           {10, 0.0933033004},
                                                           {50, 0.0707106814},
                                                           {99, 0.0503477752},
                                                           {100, 0.0500000007},
                                                           {150, 0.0353553407},
                                                           {1000, 9.76562515e-05}});
  check_steps(schedules::ExponentialDecay(0.1, 100, 0.5, /*staircase=*/true),
              {{0, 0.100000001},
               {99, 0.100000001},
               {100, 0.0500000007},
               {150, 0.0500000007},
               {1000, 9.76562515e-05}});
  CHECK_THROWS(schedules::ExponentialDecay(0.1, 0, 0.5));
}

TEST_CASE("PiecewiseConstant matches Keras' PiecewiseConstantDecay", "[cpu][optim]") {
  check_steps(
      schedules::PiecewiseConstant({10, 20}, {1.0, 0.5, 0.1}),
      {{0, 1}, {9, 1}, {10, 1}, {11, 0.5}, {20, 0.5}, {21, 0.100000001}, {1000, 0.100000001}});
  CHECK_THROWS_WITH(schedules::PiecewiseConstant({10, 20}, {1.0, 0.5}),
                    Catch::Contains("need 3 values"));
  CHECK_THROWS_WITH(schedules::PiecewiseConstant({20, 10}, {1.0, 0.5, 0.1}),
                    Catch::Contains("increase"));
}

TEST_CASE("CosineDecay matches Keras, with and without warmup", "[cpu][optim]") {
  check_steps(schedules::CosineDecay(0.1, 100, /*alpha=*/0.1), {{0, 0.100000001},
                                                                {1, 0.0999777913},
                                                                {9, 0.0982132182},
                                                                {20, 0.0914057642},
                                                                {50, 0.054999996},
                                                                {99, 0.0100222062},
                                                                {100, 0.0100000007},
                                                                {1000, 0.0100000007}});
  check_steps(schedules::CosineDecay(0.0, 100, 0.0, /*warmup_target=*/0.2, /*warmup_steps=*/10),
              {{0, 0},
               {1, 0.0200000014},
               {5, 0.100000001},
               {9, 0.179999992},
               {10, 0.200000003},
               {11, 0.19995065},
               {20, 0.195105657},
               {50, 0.130901694},
               {99, 0.00591192255},
               {100, 0.00489435205},
               {110, 0},
               {1000, 0}});
}

TEST_CASE("An optimizer takes a number or a schedule as its learning rate", "[cpu][optim]") {
  optim::Adam constant({.learning_rate = 3e-4});
  CHECK(constant.current_learning_rate() == 3e-4);
  CHECK(constant.learning_rate()(12345) == 3e-4);
  optim::Adam decayed({.learning_rate = schedules::ExponentialDecay(0.1, 100, 0.5)});
  CHECK(decayed.current_learning_rate() == Approx(0.1));
  decayed.set_iterations(100);
  CHECK(decayed.current_learning_rate() == Approx(0.05));
  CHECK_THAT(decayed.config_json(),
             Catch::Contains("{\"class_name\": \"ExponentialDecay\", \"config\": "
                             "{\"initial_learning_rate\": 0.1, \"decay_steps\": 100, "
                             "\"decay_rate\": 0.5, \"staircase\": false}}"));
}
