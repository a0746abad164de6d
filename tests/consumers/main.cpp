// A user's program, built against Tandem each way a project can depend on it (tests/consumers/:
// find_package after an install, FetchContent or add_subdirectory, pkg-config from a Makefile):
// y = sum(x * x) has the gradient 2x. Exits non-zero when the headers, the library or its
// dependencies do not give that answer.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;

int main() {
  try {
    std::cout << "Tandem " << td::build_info().version << "\n";
    td::Tensor x = td::Tensor::from_vector<float>({1.0f, -2.0f, 3.0f}, {3});
    td::GradientTape tape;
    tape.watch(x);
    td::Tensor y = td::ops::sum(x * x);
    td::Tensor dy_dx = tape.gradient(y, x);

    const std::vector<float> grad = dy_dx.to_vector<float>();
    const std::vector<float> expected = {2.0f, -4.0f, 6.0f};
    bool ok = y.item<float>() == 14.0f && grad.size() == expected.size();
    for (size_t i = 0; ok && i < grad.size(); ++i) ok = std::fabs(grad[i] - expected[i]) < 1e-6f;
    std::cout << "y = " << y.item<float>() << ", dy/dx = " << dy_dx << "\n";
    if (!ok) {
      std::cerr << "tandem_consumer: FAILED: expected y = 14 and dy/dx = [2, -4, 6]\n";
      return EXIT_FAILURE;
    }
    std::cout << "tandem_consumer: OK\n";
    return EXIT_SUCCESS;
  } catch (const std::exception& error) {
    std::cerr << "tandem_consumer: " << error.what() << "\n";
    return EXIT_FAILURE;
  }
}
